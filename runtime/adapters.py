"""An engine's LoRA adapters: loaded with the model, by id in load order, each with a default
scale (the load's, changed by POST /lora-adapters), and a request's own scales in their
place when it names some (llama-server's `lora` field: an adapter it does not name is off).

llama.cpp applies adapters to a whole context, not to a sequence. So a set of scales is a
request's *adapter set*: the scheduler decodes one set per llama_decode call (grouping the
requests that share one), and a sequence's cached KV is only reused by a request of the
same set (`claim`). The disk prompt cache is keyed by the load's scales, so only requests
with those use it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tallow.common.files import sha256_file
from tallow.models.adapter import check_adapters
from tallow.runtime.types import LoraSpec

Scales = tuple[float, ...]


class Adapters:
    def __init__(self, model, ctx, specs: tuple[LoraSpec, ...], model_paths: list[Path]) -> None:
        self.ctx, self.specs = ctx, specs
        self.loaded: list = []
        self.facts: list = []
        if specs:
            from tallow.runtime.backend.lora import Adapter

            self.facts = check_adapters([s.path for s in specs], model_paths)
            self.loaded = [Adapter(model, s.path) for s in specs]
        self.initial: Scales = tuple(s.scale for s in specs)
        self.defaults: Scales = self.initial
        self._applied: Scales = tuple(0.0 for _ in specs)  # what the context has now: none
        self._made_with: dict[int, Scales] = {}  # a sequence (by id) -> the set its KV was made with

    def scales(self, lora: Scales | None) -> Scales:
        """A request's adapter set: its own scales, or the defaults."""
        return self.defaults if lora is None else lora

    def claim(self, sequence, lora: Scales | None) -> Scales:
        """The set a request runs with, on `sequence`: the sequence's cached cells are dropped
        when they were computed with another set (their keys and values would be wrong)."""
        key = self.scales(lora)
        if self.loaded and self._made_with.get(id(sequence), key) != key:
            sequence.clear()
        self._made_with[id(sequence)] = key
        return key

    def apply(self, key: Scales | None) -> None:
        """Put this set on the context before a decode of its requests."""
        if key is not None and key != self._applied and self.loaded:
            from tallow.runtime.backend.lora import apply

            apply(self.ctx, [(a, s) for a, s in zip(self.loaded, key) if s != 0.0])
            self._applied = key

    def disk_ok(self, key: Scales) -> bool:
        """Whether a request of this set may use the disk prompt cache (keyed by the load's)."""
        return key == self.initial

    def identity(self) -> list[Any]:
        """The adapters and scales the disk prompt cache's key holds."""
        return [[sha256_file(s.path), s.scale] for s in self.specs]

    def describe(self) -> list[dict[str, Any]]:
        """GET /lora-adapters: each adapter with its id and default scale."""
        return [{"id": i, "path": str(s.path), "scale": self.defaults[i], "task_name": f.task_name,
                 "prompt_prefix": f.prompt_prefix} for i, (s, f) in enumerate(zip(self.specs, self.facts))]

    def request_scales(self, entries: list[tuple[int, float]]) -> Scales:
        """The set for [(id, scale)] as llama-server reads it: an adapter not named is off."""
        out = [0.0] * len(self.specs)
        for i, scale in entries:
            out[i] = scale
        return tuple(out)


def next_group(jobs: list, last: Scales | None) -> tuple[Scales | None, list]:
    """The adapter set to decode this step, and its jobs (each has `.lora`): with one set,
    every job; with several, the sets take turns step by step, in the order their oldest
    jobs came, so no set waits more than a step per other set."""
    keys = list(dict.fromkeys(j.lora for j in jobs))
    if len(keys) <= 1:
        return (keys[0] if keys else last), jobs
    key = keys[(keys.index(last) + 1) % len(keys)] if last in keys else keys[0]
    return key, [j for j in jobs if j.lora == key]
