"""Flags that travel together, as typed objects: a command takes `load: LoadFlags` instead of
ten parameters, and the group knows how to turn itself into settings and which of its flags
were given. `with_groups` makes each group's fields flags of the command (Typer sees them as
ordinary parameters, so `--help`, completion and the presets' "was this flag given" work as
before) and hands the command one object per group.
"""

from __future__ import annotations

import functools
import inspect
import typing
from dataclasses import replace
from typing import Any, Callable

from tallow.cli import options as o


class FlagGroup:
    """A group of flags: each annotated class attribute is a flag (its annotation an Annotated
    Typer option, its value the default). A plain class, not a dataclass: every command's
    import makes its groups, and a dataclass's generated methods cost start-up time."""

    def __init__(self, **values: Any) -> None:
        for name in self.flag_names():
            setattr(self, name, values[name] if name in values else getattr(type(self), name))

    @classmethod
    def flag_names(cls) -> list[str]:
        return list(cls.__annotations__)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{n}={getattr(self, n)!r}' for n in self.flag_names())})"


def with_groups(**groups: type[FlagGroup]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A decorator: the command's parameter named `key` takes an instance of `groups[key]`,
    built from that group's flags (FlagGroup's annotated attributes)."""
    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(command, eval_str=True)
        members = {key: cls.flag_names() for key, cls in groups.items()}

        @functools.wraps(command)
        def wrapper(**kwargs: Any) -> Any:
            made = {key: cls(**{n: kwargs.pop(n) for n in members[key]}) for key, cls in groups.items()}
            return command(**kwargs, **made)

        own = [p for p in signature.parameters.values() if p.name not in groups]
        added = []
        for cls in groups.values():
            hints = typing.get_type_hints(cls, include_extras=True)
            added += [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=getattr(cls, n),
                                        annotation=hints[n]) for n in cls.flag_names()]
        wrapper.__signature__ = signature.replace(parameters=[*own, *added])  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in [*own, *added] if p.annotation is not p.empty}
        return wrapper
    return decorate


class ModelFiles(FlagGroup):
    """Files loaded with the model: a projector in place of the stored one, LoRA adapters."""

    mmproj: o.Mmproj = None
    lora: o.Lora = None

    def given(self) -> dict[str, bool]:
        return {"--mmproj": self.mmproj is not None, "--lora": bool(self.lora)}


class LoadFlags(FlagGroup):
    """How the local engine loads the model: context, threads, GPUs, attention, KV cache."""

    ctx: o.Ctx = None
    threads: o.Threads = None
    gpu_layers: o.GpuLayers = "auto"
    device: o.Device = None
    main_gpu: o.MainGpu = 0
    split_mode: o.SplitMode = "layer"
    tensor_split: o.TensorSplit = None
    flash_attn: o.FlashAttn = "auto"
    cache_type_k: o.CacheTypeK = "f16"
    cache_type_v: o.CacheTypeV = "f16"

    def given(self) -> dict[str, bool]:
        """Each flag, and whether it was set (with --endpoint, a local flag is refused by name)."""
        return {"--ctx": self.ctx is not None, "--threads": self.threads is not None,
                "--gpu-layers": self.gpu_layers != "auto", "--device": self.device is not None,
                "--main-gpu": self.main_gpu != 0, "--split-mode": self.split_mode != "layer",
                "--tensor-split": self.tensor_split is not None, "--flash-attn": self.flash_attn != "auto",
                "--cache-type-k": self.cache_type_k != "f16", "--cache-type-v": self.cache_type_v != "f16"}

    def settings(self, files: ModelFiles | None = None):
        """runtime.types.LoadSettings from the flags (and the files given), each checked."""
        type_k, type_v, flash_attn = o.cache_types(self.cache_type_k, self.cache_type_v, self.flash_attn)
        load = o.load_settings(self.ctx, self.threads, self.gpu_layers, flash_attn, type_k, type_v)
        load = replace(load, placement=o.placement(self.device, self.main_gpu, self.split_mode, self.tensor_split))
        if files is None:
            return load
        return replace(load, mmproj=o.checked_mmproj(files.mmproj), loras=o.loras(files.lora))


class DraftFlags(FlagGroup):
    """Speculative decoding: lookup drafts or a draft model, and the draft model's limits."""

    draft: o.Draft = None
    draft_max: o.DraftMax = 16
    draft_min: o.DraftMin = 0
    draft_p_min: o.DraftPMin = 0.75

    def given(self) -> dict[str, bool]:
        return {"--draft": self.draft is not None,
                "--draft-max": o.draft_limits_given(self.draft_max, self.draft_min, self.draft_p_min)}

    def method(self) -> str | None:
        """The request's draft method: "lookup", "model" or None."""
        return o.parse_draft(self.draft)

    def loaded(self, load, offline: bool, target: str):
        """The load with the draft model's files and limits (--draft MODEL or auto)."""
        return o.draft_model(load, self.draft, offline, self.draft_max, self.draft_min, self.draft_p_min, target)


class ShowFlags(FlagGroup):
    """What a run or chat shows besides the answer."""

    stats: o.Stats = False
    quiet: o.Quiet = False
    hide_thinking: o.HideThinking = False

    def stats_line(self, as_json: bool = False) -> bool:
        """Whether to print the stats line: asked for, or stderr is a terminal (and the answer is not JSON)."""
        from tallow.cli.render import stderr_is_terminal

        return not self.quiet and (self.stats or (stderr_is_terminal() and not as_json))


class FormatFlags(FlagGroup):
    """The answer's shape: one JSON object, one that follows a schema, or a GBNF grammar's."""

    format_: o.Format = None
    json_schema: o.JsonSchema = None
    grammar: o.Grammar = None

    def structured(self):
        """(the GBNF grammar, the checked schema) the answer must follow; (None, None) for free text."""
        return o.structured(self.format_, self.json_schema, self.grammar)


class EndpointFlags(FlagGroup):
    """Another server in the place of the local engine."""

    endpoint: o.Endpoint = None
    api_key: o.EndpointKey = None

    def servers(self, offline: bool, many: bool = False) -> list:
        """The servers named (--endpoint or TALLOW_ENDPOINT), checked; [] for the local engine."""
        return o.endpoints(self.endpoint, self.api_key, offline, many)
