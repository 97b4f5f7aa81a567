"""What the engine takes and what it yields."""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tallow.common.fields import default
from tallow.runtime.drafting.recall import BUDGET as RECALL_BUDGET


@dataclass(frozen=True)
class Placement:
    """Which GPUs a model's layers go to, in llama.cpp's terms (--device, --main-gpu,
    --split-mode, --tensor-split)."""

    devices: tuple[str, ...] = ()  # ggml device names (Vulkan0, CUDA1); (): every GPU
    main_gpu: int = 0  # with split mode none: the one GPU (an index into the devices)
    split_mode: str = "layer"  # none | layer | row
    tensor_split: tuple[float, ...] = ()  # each device's share, in order

    SPLIT_MODES = ("none", "layer", "row")


@dataclass(frozen=True)
class DraftLimits:
    """Drafting with a model, by llama.cpp's names: --draft-max, --draft-min, --draft-p-min."""
    max: int = 16
    min: int = 0  # the adaptive length's floor: with min >= 1 a sequence always drafts
    p_min: float = 0.75  # stop drafting where the draft's top probability falls under this


@dataclass(frozen=True)
class LoraSpec:
    """A LoRA adapter to load with the model (--lora FILE[:SCALE], a Modelfile's ADAPTER)."""
    path: Path
    scale: float = 1.0  # the default for requests that name no adapters (0: loaded, not applied)


@dataclass(frozen=True)
class Persona:
    """A created model's conversation settings (models/preset.py, from its Modelfile): put
    around every conversation that is not raw (runtime/template.py, `framed`)."""
    system: str | None = None  # the system prompt, unless the conversation has its own
    messages: tuple[tuple[str, str], ...] = ()  # (role, content): few-shot turns after the system prompt
    template: str | None = None  # a Jinja chat template in place of the model's


@dataclass(frozen=True)
class LoadSettings:
    """How to load a model; every field is explicit (the CLI resolves defaults from the environment)."""

    n_ctx: int | None = None  # None: the model's trained length, capped at ctx_cap
    ctx_cap: int = 4096
    n_threads: int | None = None  # None: physical cores
    gpu_layers: str = "auto"  # auto | all | N
    flash_attn: str = "auto"  # auto | on | off
    n_batch: int = 512
    echo_logs: bool = False
    observer: Any = None  # runtime.backend.observer.ActivationStats, to collect an importance matrix
    type_k: str = "f16"  # KV cache types
    type_v: str = "f16"
    n_seq_max: int = 1  # sequences the context can hold at once (more for parallel decoding)
    kv_unified: bool | None = None  # one KV buffer shared by all sequences; None: when n_seq_max > 1
    check_memory: bool = True  # estimate memory before loading, and refuse what cannot fit
    memory: int | None = None  # RAM available to the model in bytes (None: what the machine has free now)
    vram: int | None = None  # free GPU memory in bytes (None: ask the GPU backend)
    machine: Any = None  # runtime.calibration.machine.Profile: repack verdict and flash-attention timings
    repack: bool | None = None  # repacked weight layouts (extra buffers); None: the machine's verdict
    workload: object = None  # runtime.machine.Workload for flash_attn "auto" (None: fill the context)
    registry: Path | None = None  # folder of the running engines' thread claims (runtime/host/threads.py)
    related_pids: tuple[int, ...] = ()  # processes whose CPU time is this engine's own work (a runner's server)
    adapt_threads: bool = True  # follow the cores free while decoding (unless n_threads pins it)
    embeddings: bool = False  # an embedding context (runtime/embedding/embed.py): pooled vectors, no sampling
    pooling: str | None = None  # mean | cls | last | rank | None: the model's own (runtime/embedding/embed.py)
    mmproj: Path | None = None  # a projector (mmproj GGUF) for images in prompts (runtime/media/__init__.py)
    placement: Placement = Placement()  # which GPUs, when there are several
    draft: tuple[Path, ...] = ()  # a draft model's files, for speculative decoding (runtime/drafting/draft_model.py)
    draft_limits: DraftLimits = DraftLimits()
    draft_name: str | None = None  # the draft model's name, as reports show it (None: its file's)
    recall: int = RECALL_BUDGET  # tokens of earlier requests remembered per tenant for lookup drafts; 0: none (runtime/drafting/recall.py)
    persona: Persona = Persona()  # a created model's system prompt, few-shot turns and template
    loras: tuple[LoraSpec, ...] = ()  # LoRA adapters, by id (their order): runtime/adapters.py


@dataclass(frozen=True)
class Sampling:
    """A request's sampling settings: the sampling rows of the field table (common/fields.py),
    which holds their ranges, defaults and help; the test of the table checks the two agree."""

    temperature: float = default("temperature")
    top_k: int = default("top_k")
    top_p: float = default("top_p")
    min_p: float = default("min_p")
    repeat_penalty: float = default("repeat_penalty")
    repeat_last_n: int = default("repeat_last_n")
    seed: int | None = default("seed")  # None: a fresh random seed per request
    frequency_penalty: float = default("frequency_penalty")
    presence_penalty: float = default("presence_penalty")
    typical_p: float = default("typical_p")
    mirostat: int = default("mirostat")
    mirostat_tau: float = default("mirostat_tau")
    mirostat_eta: float = default("mirostat_eta")

    @property
    def penalized(self) -> bool:
        return self.repeat_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0

    def resolved_seed(self) -> int:
        # llama.cpp's seeds are 32-bit: a wider one (the field table allows 64) is reduced here
        return self.seed & 0xFFFFFFFF if self.seed is not None else random.SystemRandom().randrange(2**32)


@dataclass(frozen=True)
class Request:
    prompt_tokens: list[int]
    max_tokens: int | None = None  # None: until the end of the context
    stop: tuple[str, ...] = ()
    sampling: Sampling = field(default_factory=Sampling)
    ignore_eos: bool = False  # never sample end-of-generation (benchmarks need exact lengths)
    reasoning_markers: tuple[str, str] | None = None  # e.g. ("<think>", "</think>")
    starts_in_reasoning: bool = False  # the prompt opened a reasoning block
    cache_points: tuple[int, ...] = ()  # prefix lengths worth saving to disk (a system prompt, a document)
    turns: tuple[int, ...] = ()  # where turns begin: checkpoints, for a cache that cannot be cut back (Model.rewinds)
    disk_cache: bool = True  # look up and save prompt prefixes in the disk cache, when one is attached
    reuse_cache: bool = True  # False: evaluate the whole prompt, no prefix reused from memory or disk (cache_prompt)
    save_prompt: bool = True  # False: look saved prefixes up but never save this one (a chat keeps its own cache)
    draft: str | None = None  # "lookup": drafts found in the prompt and output; "model": the loaded draft model's
    prediction: tuple[int, ...] = ()  # the answer the client expects (OpenAI's Predicted Outputs): lookup drafts from it
    grammar: str | None = None  # GBNF constraining the answer (from runtime/grammar/__init__.py, checked)
    logprobs: int | None = None  # report each token's log-probability, and this many top alternatives
    post_probs: bool = False  # with logprobs: probabilities after the sampler chain instead (llama.cpp's)
    progress: bool = False  # a ProgressEvent after each chunk of the prompt evaluated (llama.cpp's return_progress)
    lazy_grammar: Any = None  # runtime.tools.constrain.LazyGrammar: constrain a tool call once the answer opens one
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token, added to its logit); -inf bans it
    media: tuple[Any, ...] = ()  # runtime.multimodal.Span: the media chunks among prompt_tokens, in order
    notes: tuple[str, ...] = ()  # what was cut to make the prompt fit (a video's frames), for the person asking
    lora: tuple[float, ...] | None = None  # each loaded adapter's scale, by id; None: the engine's defaults
    reasoning_budget: int | None = None  # tokens the reasoning section may take, its closing marker included
    tenant: str | None = None  # who asked (an API key's name): metered per tenant when the scheduler has a meter
    trace: str | None = None  # the server's id for the request: its journal's answer record (serve/http/journal.py)


@dataclass
class Usage:
    prompt_tokens: int | None = 0  # None: a remote server did not report it (client/endpoint.py)
    cached_tokens: int | None = 0  # None: not reported
    completion_tokens: int = 0
    reasoning_tokens: int = 0  # part of completion_tokens spent inside a reasoning block
    cache_source: str | None = None  # where cached_tokens came from: "memory" or "disk"
    draft_tokens: int = 0  # tokens proposed by speculative decoding
    accepted_tokens: int = 0  # ... of which the model confirmed
    draft_steps: int = 0  # decode steps that verified a draft (draft_tokens / draft_steps: the mean length)
    draft: str | None = None  # what drafted: "lookup", or the draft model's name
    media_tokens: int = 0  # part of prompt_tokens that images and audio stand for
    audio_tokens: int = 0  # ... of which audio

    @property
    def acceptance(self) -> float | None:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else None

    @property
    def draft_length(self) -> float | None:
        """The mean length of the drafts verified."""
        return self.draft_tokens / self.draft_steps if self.draft_steps else None


def percentile(values, q: float) -> float:
    """The nearest-rank q-th percentile (0 for no values): no interpolation, so it is always a
    measured value."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, min(len(ordered), int(-(-q * len(ordered) // 100))))
    return ordered[rank - 1]


@dataclass
class Timings:
    """Seconds measured by tallow itself with perf_counter, per request."""

    load_ms: float = 0.0
    queue_ms: float = 0.0
    prefill_tokens: int = 0
    prefill_ms: float = 0.0
    ttft_ms: float = 0.0
    decode_tokens: int = 0
    decode_ms: float = 0.0
    total_ms: float = 0.0
    itl_ms: list[float] = field(default_factory=list)  # every inter-token gap
    media_ms: float = 0.0  # encoding images (part of prefill and TTFT)

    @property
    def prefill_tps(self) -> float:
        return self.prefill_tokens / (self.prefill_ms / 1000) if self.prefill_ms > 0 else 0.0

    @property
    def decode_tps(self) -> float:
        return self.decode_tokens / (self.decode_ms / 1000) if self.decode_ms > 0 else 0.0

    def itl_percentile(self, q: float) -> float:
        return percentile(self.itl_ms, q)

    def summary(self) -> dict[str, float]:
        return {
            "load_ms": round(self.load_ms, 3),
            "queue_ms": round(self.queue_ms, 3),
            "ttft_ms": round(self.ttft_ms, 3),
            "prefill_tokens": self.prefill_tokens,
            "prefill_ms": round(self.prefill_ms, 3),
            "prefill_tps": round(self.prefill_tps, 2),
            "decode_tokens": self.decode_tokens,
            "decode_ms": round(self.decode_ms, 3),
            "decode_tps": round(self.decode_tps, 2),
            "itl_p50_ms": round(self.itl_percentile(50), 3),
            "itl_p95_ms": round(self.itl_percentile(95), 3),
            "total_ms": round(self.total_ms, 3),
            **({"media_ms": round(self.media_ms, 3)} if self.media_ms else {}),
        }


@dataclass(frozen=True)
class TokenEvent:
    text: str  # answer text; may be empty while a character or a possible stop string is held back
    token: int
    reasoning: str = ""  # reasoning text this token produced (never part of `text`)
    logprob: float | None = None  # the model's log-probability of the token (when asked for)
    top_logprobs: tuple[tuple[int, float], ...] = ()  # the most likely tokens at this step
    prob: float | None = None  # with post_probs: the token's probability after the sampler chain
    top_probs: tuple[tuple[int, float], ...] = ()  # with post_probs: the chain's likeliest candidates


@dataclass(frozen=True)
class ProgressEvent:
    """How far a prompt's evaluation has come, after each chunk of it (Request.progress)."""

    total: int  # the prompt's tokens
    cached: int  # ... of which reused from a cache
    processed: int  # ... of which in the context now (the cached ones included)


@dataclass
class FinalEvent:
    text: str  # the whole answer: the TokenEvents' text, then `tail`
    finish_reason: str  # stop | length | interrupted
    usage: Usage
    timings: Timings
    tail: str = ""  # answer text held back until the end (not yet in any TokenEvent)
    reasoning: str = ""  # the whole reasoning: the TokenEvents' reasoning, then `reasoning_tail`
    reasoning_tail: str = ""
    stop_sequence: str | None = None  # the stop string that ended the answer, if one did
    source: str | None = None  # the endpoint that answered, when remote: the timings are then the client's

    def to_dict(self) -> dict:
        out = {"finish_reason": self.finish_reason, "usage": asdict(self.usage), "timings": self.timings.summary()}
        u = self.usage
        if u.draft is not None:  # the drafting's outcome, derived (the counts are in usage)
            out["draft"] = {"with": u.draft, "acceptance": u.acceptance, "mean_length": u.draft_length}
        if self.source is not None:
            out["endpoint"] = self.source
        if self.reasoning:
            out["reasoning"] = self.reasoning
        return out


@dataclass(frozen=True)
class NoticeEvent:
    """Something the user should be told about a turn (e.g. old turns dropped to fit)."""

    message: str


# The parameters of runtime/backend/'s Context and Sampler: plain data, kept here so the
# backend holds only what touches llama.cpp.
@dataclass(frozen=True)
class ContextParams:
    n_ctx: int
    n_batch: int
    n_ubatch: int
    n_threads: int
    flash_attn: str = "auto"
    n_seq_max: int = 1  # more for decoding several sequences at once
    observer: Any = None  # an ActivationStats to call for every matrix product (imatrix)
    type_k: str = "f16"  # KV cache types (ggml type names)
    type_v: str = "f16"
    kv_unified: bool | None = None  # None: unified exactly when there are several sequences
    embeddings: bool = False  # pooled embeddings out instead of logits
    pooling: int | None = None  # llama.cpp's pooling type; None: the model's


@dataclass(frozen=True)
class SamplerParams:
    temperature: float
    top_k: int
    top_p: float
    min_p: float
    repeat_penalty: float
    repeat_last_n: int
    seed: int
    banned: tuple[int, ...] = ()  # tokens that may never be sampled (e.g. end-of-generation)
    grammar: str | None = None  # GBNF, already checked (runtime/grammar/__init__.py)
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    bias: tuple[tuple[int, float], ...] = ()  # (token, added to its logit), before the other samplers
    typical_p: float = 1.0
    mirostat: tuple[int, float, float] = (0, 5.0, 0.1)  # version (0: off), tau, eta
    keep_probs: int = 0  # record this many candidates' post-sampling probabilities per step (0: none)


@dataclass(frozen=True)
class SchedulerSettings:
    parallel: int = 4  # sequences decoded together
    deterministic: bool = False  # answers independent of the other requests in the batch
    kv_unified: bool = False  # one KV buffer for all (a request may use all of it); else a stream each
    max_queue: int = 64  # requests that may wait for a slot; more are refused
    max_tokens_cap: int | None = None  # clamp on a request's max_tokens (None: the sequence's room)
    time_limit_s: float | None = None  # per request, from submission; finish_reason "time_limit"
    draft: str | None = None  # the draft method of requests that name none ("lookup")
