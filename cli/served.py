"""A served model's load and fingerprint from its runner settings: the runner process and a
`serve --ray` replica make them the same way."""

from __future__ import annotations

from pathlib import Path

from tallow.cli import options as o
from tallow.serve.config import RunnerConfig


def runner_load(c: RunnerConfig):
    """How a served model loads, from its runner settings (here, and on a Ray replica)."""
    from dataclasses import replace

    load = o.with_draft(o.load_settings(c.ctx, c.threads, c.gpu_layers, c.flash_attn, c.type_k, c.type_v), c.draft)
    load = replace(load, placement=o.placement(c.device, c.main_gpu, c.split_mode, c.tensor_split))
    if c.mmproj is not None:
        load = replace(load, mmproj=Path(c.mmproj))
    if c.loras:
        from tallow.runtime.types import LoraSpec

        load = replace(load, loras=tuple(LoraSpec(Path(p), s) for p, s in c.loras))
    if c.draft_files:
        from tallow.runtime.types import DraftLimits

        load = replace(load, draft=tuple(Path(p) for p in c.draft_files),
                       draft_limits=DraftLimits(c.draft_max, c.draft_min, c.draft_p_min), draft_name=c.draft_name)
    return load


def fingerprint(digest: str | None, deterministic: bool) -> str:
    """system_fingerprint: tallow's version, the model's digest, the deterministic flag."""
    from importlib.metadata import version

    return f"tallow-{version('tallow')}-{(digest or 'local')[:12]}" + ("-det" if deterministic else "")
