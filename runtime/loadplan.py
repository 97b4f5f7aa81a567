"""The load plan: what a model load will use, decided from the GGUF headers and the
machine before anything is allocated: context size, GPU layers, memory estimate, flash
attention and extra buffers (docs/DESIGN.md, "Memory model" and "Calibration")."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tallow.common.errors import TallowError
from tallow.runtime.types import LoadSettings

if TYPE_CHECKING:
    from tallow.models.memory import Estimate


def gpu_layer_count(choice: str, offload_supported: bool, fit_layers: int | None = None) -> int:
    """auto: as many layers as fit in free GPU memory (all when that is unknown), none
    without a GPU build; all; or a number."""
    if choice == "auto":
        if not offload_supported:
            return 0
        return -1 if fit_layers is None else fit_layers
    if choice == "all":
        return -1
    return int(choice)


def default_context(settings: LoadSettings, n_ctx_train: int) -> int:
    """--ctx, or each sequence gets the model's trained length capped at ctx_cap."""
    per_seq = min(n_ctx_train or settings.ctx_cap, settings.ctx_cap)
    return settings.n_ctx or per_seq * settings.n_seq_max


@dataclass(frozen=True)
class MemoryPlan:
    n_ctx: int
    gpu_layers: int
    estimate: Estimate
    ram: int  # what was free
    note: str | None  # the default context was shrunk to fit
    problem: TallowError | None  # "needs X, have Y" and what would fit; None when it fits
    flash_attn: str = "auto"  # as the load will decide it (it changes the compute figure)
    extra_buffers: bool = True


def read_shape(paths: list[Path]):
    from tallow.models.gguf_file import read_gguf
    from tallow.models.memory import Shape

    return Shape.from_gguf([read_gguf(p) for p in paths])


def check_kv_types(paths: list[Path], settings: LoadSettings, shape=None) -> None:
    """Refuse KV cache types the model's heads cannot hold, before llama.cpp fails to make a
    context without saying why."""
    from tallow.models.memory import kv_type_problem

    if (settings.type_k, settings.type_v) == ("f16", "f16"):
        return
    problem = kv_type_problem(shape or read_shape(paths), settings.type_k, settings.type_v)
    if problem is not None:
        raise TallowError(f"the KV cache cannot be {settings.type_k}/{settings.type_v}: {problem}",
                          "use --cache-type-k/--cache-type-v f16 (or a type whose block fits)")


def choose_flash_attn(settings: LoadSettings, shape, offload_supported: bool = False) -> str:
    """--flash-attn, or for "auto" what this machine's timings say suits the context's work.
    Where the layers go to a GPU the CPU's timings say nothing: "auto" is left to llama.cpp,
    which turns flash attention on where the device supports it (as llama-server does)."""
    from tallow.runtime.calibration.machine import Workload

    if settings.flash_attn != "auto":
        return settings.flash_attn
    if offload_supported and settings.gpu_layers != "0":
        return "auto"
    if settings.machine is None or shape is None:
        return settings.flash_attn
    if settings.type_v not in ("f16", "bf16", "f32"):
        return "on"  # llama.cpp needs flash attention for a quantized V cache
    if settings.n_seq_max > 1:
        # Several sequences (serve, batch): the calibration times one. With a KV stream per
        # slot, 8 slots decoded 131 tok/s in all with it on against 122 off (default model,
        # 2 threads; llama-server's "auto" is on too).
        return "on"
    work = settings.workload
    if work is None:  # a long-lived context (chat, serve): assume it fills up, half prompt, half answer
        per_seq = default_context(settings, shape.n_ctx_train) // max(1, settings.n_seq_max)
        work = Workload(per_seq // 2, per_seq // 2)
    return settings.machine.flash_attn_for(shape, work)


def depth_prediction(settings: LoadSettings, shape, mode: str) -> float | None:
    """What a context checks its decode speed against (runtime/calibration/watch.py): the
    calibration's growth of a step's time per position of depth, where the calibration made
    the flash-attention choice (one sequence, "auto", a V cache either mode takes); else None."""
    machine = settings.machine
    if settings.flash_attn != "auto" or settings.n_seq_max > 1 or machine is None or shape is None \
            or settings.type_v not in ("f16", "bf16", "f32") or machine.busy or machine.seen:
        return None
    return machine.decode_slope(shape, mode)


def extra_buffers(settings: LoadSettings) -> bool:
    """The load's own choice, else the machine's repack verdict; without one, extra buffers
    only where no type needs a probe."""
    if settings.repack is not None:
        return settings.repack
    if settings.machine is not None:
        return settings.machine.repack
    from tallow.runtime.calibration.machine import PROBED
    from tallow.runtime.host.devices import extra_buffer_types

    return not any(t in PROBED for t in extra_buffer_types())


def plan_memory(paths: list[Path], settings: LoadSettings, offload_supported: bool, vram: int | None,
                shape=None) -> MemoryPlan:
    """The context, GPU layers and memory estimate for a load, from the GGUF headers alone,
    and why it cannot fit if it cannot."""
    from dataclasses import replace

    from tallow.models.memory import CTX_STEP, available_memory, check_fit, estimate, largest_context, layers_for_vram

    shape = shape or read_shape(paths)
    settings = replace(settings, flash_attn=choose_flash_attn(settings, shape, offload_supported))
    ram = settings.memory if settings.memory is not None else available_memory()
    kw: dict[str, Any] = dict(type_k=settings.type_k, type_v=settings.type_v, n_batch=settings.n_batch,
                              n_seq=settings.n_seq_max, flash_attn=settings.flash_attn != "off",
                              projector=projector_bytes(settings.mmproj))
    n_ctx = default_context(settings, shape.n_ctx_train)
    fit_layers = None
    if settings.gpu_layers == "auto" and offload_supported and vram is not None:
        fit_layers = layers_for_vram(shape, vram, n_ctx, **kw)
    layers = gpu_layer_count(settings.gpu_layers, offload_supported, fit_layers)
    est = estimate(shape, n_ctx, gpu_layers=layers if offload_supported else 0, **kw)
    note = None
    if settings.n_ctx is None and est.ram > ram:  # the default context shrinks to what fits
        smaller = largest_context(shape, ram, n_ctx, gpu_layers=est.gpu_layers, **kw)
        if smaller >= CTX_STEP * settings.n_seq_max:
            note = f"context {smaller} (of {n_ctx}) to fit in {ram / 1e9:.1f} GB of free memory"
            n_ctx, est = smaller, estimate(shape, smaller, gpu_layers=est.gpu_layers, **kw)
    try:
        check_fit(shape, est, ram, vram if offload_supported and layers else None, **kw)
        problem = None
    except TallowError as exc:
        problem = exc
    return MemoryPlan(n_ctx, layers, est, ram, note, problem, settings.flash_attn, extra_buffers(settings))


def check_draft_fit(paths: list[Path], settings: LoadSettings, plan: MemoryPlan, offload_supported: bool,
                    vram: int | None) -> None:
    """Raise DraftError when a draft model cannot load next to the target `plan` is for: the
    draft gets a context as long as the target's, in the memory the target leaves."""
    room = None if vram is None else max(0, vram - plan.estimate.vram)
    _check_draft(paths, settings, plan.n_ctx, plan.ram - plan.estimate.ram, offload_supported, room)


def check_draft_room(paths: list[Path], settings: LoadSettings, n_ctx: int, offload: bool) -> None:
    """Raise DraftError when a draft model cannot load now, next to a loaded model of context
    `n_ctx` (`offload`: its layers, hence the draft's, go to a GPU): the memory free now
    already counts the model."""
    from tallow.runtime.host.devices import gpu_free_memory

    _check_draft(paths, settings, n_ctx, None, offload, gpu_free_memory() if offload else None)


def _check_draft(paths: list[Path], settings: LoadSettings, n_ctx: int, ram: int | None, offload: bool,
                 vram: int | None) -> None:
    """The draft planned with the target's context in `ram` (None: what is free now) and `vram`."""
    from dataclasses import replace

    from tallow.runtime.errors import DraftError

    left = replace(settings, n_ctx=n_ctx, memory=ram if ram is not None else settings.memory, mmproj=None, draft=())
    problem = plan_memory(paths, left, offload, vram).problem
    if problem is not None:
        raise DraftError(f"the draft {settings.draft_name or paths[0].name} does not fit next to the model: "
                         f"{problem.message}", "give a smaller draft model, or a shorter --ctx")


def projector_bytes(path: Path | None) -> int:
    """What a projector adds to a load: its weights and its encoder's compute buffer."""
    if path is None:
        return 0
    from tallow.models.gguf_file import read_gguf
    from tallow.models.projector import projector_memory

    weights, compute = projector_memory(read_gguf(path))
    return weights + compute


CTX_ROUNDING = 256  # llama.cpp allocates a context in steps of this many cells


def context_notes(requested: int | None, n_ctx: int, n_seq: int, n_ctx_train: int, meta) -> list[str]:
    """One-line notes on the context a load got: a --ctx that llama.cpp rounded, and a context
    longer than the model was trained for (what its RoPE scaling, if any, does about it).
    `meta(key)` reads the model's metadata."""
    notes = []
    if requested and n_ctx != requested:
        notes.append(f"context {n_ctx}, not {requested}: llama.cpp allocates the context in steps of "
                     f"{CTX_ROUNDING} cells (at least {CTX_ROUNDING})")
    per_seq = n_ctx // max(1, n_seq)
    if requested and n_ctx_train and per_seq > n_ctx_train:
        arch = meta("general.architecture") or "llama"
        scaling = meta(f"{arch}.rope.scaling.type")
        factor = meta(f"{arch}.rope.scaling.factor")
        if scaling and scaling != "none":
            how = f"its RoPE scaling ({scaling}" + (f", factor {float(factor):g}" if factor else "") + ") is meant to stretch it"
        else:
            how = (f"it has no RoPE scaling, so positions past {n_ctx_train} are ones it never saw: "
                   "expect answers to degrade there")
        notes.append(f"context {per_seq} is longer than the {n_ctx_train} tokens this model was trained on; {how}")
    return notes
