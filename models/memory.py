"""Will a model fit? Memory estimates from the GGUF header alone, before anything loads.

What llama.cpp allocates, by part (each formula checked against llama.cpp's own log of
its buffer sizes on this machine; see docs/DESIGN.md, "Memory model"):
- weights: the tensors' bytes, as stored (split between RAM and VRAM by offloaded layer);
- KV cache: n_ctx x layers x (K + V width) in the cache's types;
- compute buffers: the graph's peak for one micro-batch: the larger of the output stage
  (n_ubatch x (n_vocab + 2 n_embd) floats) and, without flash attention, the attention
  scores (n_ubatch x n_ctx x heads floats, and their f16 copy in the CPU backend's work
  buffer); plus the attention mask;
- output buffer: the logits kept for the caller (one row per sequence, or every row);
- a projector, when one is loaded: its weights and its encoder's compute buffer
  (models/projector.py, `projector_memory`).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from tallow.models.errors import TallowError

CTX_STEP = 256  # llama.cpp pads the context to a multiple of this
VRAM_MARGIN = 512 * 2**20  # left free on a GPU for the driver and fragmentation
_BLOCK = re.compile(r"^blk\.(\d+)\.")


def available_memory() -> int:
    import psutil

    return psutil.virtual_memory().available


KV_TYPES = ("f16", "bf16", "f32", "q8_0", "q5_1", "q5_0", "q4_1", "q4_0", "iq4_nl")  # llama.cpp's -ctk/-ctv choices
UNQUANTIZED_KV = ("f16", "bf16", "f32")  # a V cache of any other type needs flash attention


def kv_type_id(name: str) -> int:
    """ggml's number for a KV cache type ('f16', 'q8_0', ...); a one-line error for another."""
    from gguf import GGMLQuantizationType

    if name not in KV_TYPES:
        raise TallowError(f"unknown KV cache type {name!r}", f"use one of {', '.join(KV_TYPES)}")
    return int(GGMLQuantizationType[name.upper()])


def kv_type_problem(shape: Shape, type_k: str, type_v: str) -> str | None:
    """Why the model's KV cache cannot take these types, in words (a quantized type packs its
    values in blocks, and llama.cpp needs each head's row to be whole blocks); None: it can."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    for what, name, width in (("K", type_k, shape.head_widths[0]), ("V", type_v, shape.head_widths[1])):
        block = GGML_QUANT_SIZES[GGMLQuantizationType(kv_type_id(name))][0]  # an unknown name: its one-line error
        if width and width % block:
            return f"the model's {what} heads are {width} values wide, and {name} packs {block} at a time"
    return None


def _type_size(name: str) -> float:
    """Bytes per element of a KV cache type ('f16', 'q8_0', ...)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    block, size = GGML_QUANT_SIZES[GGMLQuantizationType(kv_type_id(name))]
    return size / block


@dataclass(frozen=True)
class Shape:
    """What the estimate needs from a model's header."""

    n_layer: int
    n_embd: int
    n_head: int
    kv_width: int  # K plus V values per token per layer
    n_vocab: int
    n_ctx_train: int
    layer_bytes: tuple[int, ...]  # weights of each block
    other_bytes: int  # embeddings, output matrix, norms
    n_params: int = 0
    head_widths: tuple[int, int] = (0, 0)  # a K head's and a V head's values (0: not known)

    @property
    def weights(self) -> int:
        return sum(self.layer_bytes) + self.other_bytes

    @classmethod
    def from_gguf(cls, infos) -> Shape:
        """From the GGUFInfo of every shard (the first holds the metadata)."""
        md = infos[0].metadata
        arch = infos[0].architecture or "llama"

        def num(key: str, default: int | None = None) -> int:
            value = md.get(f"{arch}.{key}", default)
            if isinstance(value, list):  # per-layer values (some architectures): the largest
                value = max(value) if value else default
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise TallowError(f"the model's header has no usable {arch}.{key}", "the file may be damaged")
            return value

        n_layer, n_embd = num("block_count"), num("embedding_length")
        n_head = num("attention.head_count", 1) or 1
        n_head_kv = num("attention.head_count_kv", n_head)
        k_len = num("attention.key_length", n_embd // n_head)
        v_len = num("attention.value_length", n_embd // n_head)
        tokens = md.get("tokenizer.ggml.tokens")
        n_vocab = getattr(tokens, "length", None) or (len(tokens) if isinstance(tokens, list) else 0)
        layers = [0] * n_layer
        other = n_params = 0
        for info in infos:
            for t in info.tensors:
                n_params += t.n_elements
                m = _BLOCK.match(t.name)
                if m and int(m.group(1)) < n_layer:
                    layers[int(m.group(1))] += t.n_bytes
                else:
                    other += t.n_bytes
        return cls(n_layer, n_embd, n_head, n_head_kv * (k_len + v_len), n_vocab,
                   num("context_length", 0), tuple(layers), other, n_params, (k_len, v_len))


@dataclass(frozen=True)
class Estimate:
    n_ctx: int
    gpu_layers: int
    weights: int
    kv_cache: int
    compute: int
    output: int
    vram: int  # of the total, what the GPU must hold
    projector: int = 0  # a projector's weights and compute buffer (models/projector.py), in RAM

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.compute + self.output + self.projector

    @property
    def ram(self) -> int:
        return self.total - self.vram

    def to_dict(self) -> dict[str, int]:
        return {**asdict(self), "total": self.total, "ram": self.ram}


def kv_cache_bytes(shape: Shape, n_tokens: int, type_k: str = "f16", type_v: str = "f16") -> int:
    """What the KV cache holds for `n_tokens` positions, every layer, K and V in their types
    (the one formula: the load's estimate and bench's bytes per token both use it)."""
    per_k = (_type_size(type_k) + _type_size(type_v)) / 2
    return int(n_tokens * shape.n_layer * shape.kv_width * per_k)


def estimate(shape: Shape, n_ctx: int, *, type_k: str = "f16", type_v: str = "f16", n_batch: int = 512,
             n_seq: int = 1, flash_attn: bool = True, gpu_layers: int = 0, all_logits: bool = False,
             projector: int = 0) -> Estimate:
    n_ctx = -(-n_ctx // CTX_STEP) * CTX_STEP
    n_ubatch = min(n_batch, n_ctx)
    kv = kv_cache_bytes(shape, n_ctx, type_k, type_v)
    out_stage = n_ubatch * 4 * (shape.n_vocab + 2 * shape.n_embd)
    att_stage = 0 if flash_attn else n_ubatch * n_ctx * shape.n_head * 4
    mask = n_ubatch * n_ctx * (2 if flash_attn else 4)
    # Without flash attention the CPU backend also converts the scores to f16 for the
    # product with V, in a work buffer of its own.
    work = 0 if flash_attn else n_ubatch * n_ctx * shape.n_head * 2
    compute = max(out_stage, att_stage) + mask + work
    output = (n_ubatch if all_logits else n_seq) * shape.n_vocab * 4
    layers = max(0, min(gpu_layers if gpu_layers >= 0 else shape.n_layer + 1, shape.n_layer + 1))
    offloaded = sum(shape.layer_bytes[shape.n_layer - min(layers, shape.n_layer):])
    if layers > shape.n_layer:  # "all": the output layer too
        offloaded += shape.other_bytes
    vram = 0
    if layers:
        vram = offloaded + kv * min(layers, shape.n_layer) // max(shape.n_layer, 1) + compute
    return Estimate(n_ctx, layers, shape.weights, kv, compute, output, vram, projector)


def largest_context(shape: Shape, ram: int, cap: int, **kw) -> int:
    """The largest context (a multiple of CTX_STEP, at most `cap`) whose estimate fits in `ram`; 0 if none."""
    lo, hi = 0, max(0, cap // CTX_STEP)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if estimate(shape, mid * CTX_STEP, **kw).ram <= ram:
            lo = mid
        else:
            hi = mid - 1
    return lo * CTX_STEP


def layers_for_vram(shape: Shape, free_vram: int, n_ctx: int, margin: int = VRAM_MARGIN, **kw) -> int:
    """How many layers to offload so that the GPU part fits in free_vram less a margin."""
    budget = free_vram - margin
    best = 0
    for layers in range(1, shape.n_layer + 2):
        if estimate(shape, n_ctx, gpu_layers=layers, **kw).vram <= budget:
            best = layers
    return best


def human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def check_fit(shape: Shape, est: Estimate, ram: int, vram: int | None, **kw) -> None:
    """Raise with "needs X, have Y" and what would fit, when the estimate does not fit."""
    if vram is not None and est.vram > vram:
        fits = layers_for_vram(shape, vram, est.n_ctx, **kw)
        raise TallowError(f"the model needs {human(est.vram)} of GPU memory with {est.gpu_layers} layers offloaded, "
                          f"have {human(vram)}", f"use --gpu-layers {fits} (or auto)")
    if est.ram <= ram:
        return
    hints = []
    ctx = largest_context(shape, ram, est.n_ctx - CTX_STEP, gpu_layers=est.gpu_layers, **kw)
    if ctx >= CTX_STEP:
        hints.append(f"--ctx {ctx}")
    if vram and est.gpu_layers <= shape.n_layer:
        hints.append("more --gpu-layers")
    q4 = int(shape.n_params * 4.85 / 8)  # Q4_K_M's bits per weight
    if q4 < est.weights and est.ram - est.weights + q4 <= ram:
        hints.append(f"a smaller quantization (at Q4_K_M it needs about {human(est.ram - est.weights + q4)})")
    if not hints:
        hints.append("a smaller model")
    raise TallowError(f"the model needs {human(est.ram)} of memory at context {est.n_ctx} "
                      f"(weights {human(est.weights)}, KV cache {human(est.kv_cache)}, compute {human(est.compute)}"
                      + (f", projector {human(est.projector)}" if est.projector else "") + "), "
                      f"have {human(ram)}", "try " + ", or ".join(hints))
