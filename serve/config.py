"""What a `tallow serve` process is told at start, in one typed place: `ServerConfig`, the
settings both apps (the front and a runner) read, and `RunnerConfig`, everything one runner
process is told by the server that starts it (sent as JSON on its command line). The
defaults live here and in the runtime's own settings (SchedulerSettings, Sampling); the
CLI's option defaults are read from them, so a default is written once."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from tallow.runtime.types import Sampling, SchedulerSettings

_SCHEDULER = SchedulerSettings()


@dataclass(frozen=True)
class ServerConfig:
    model: str  # the name clients use
    host: str = "127.0.0.1"
    api_key: str | None = None
    cors: tuple[str, ...] = ()
    max_body: int = 4 * 1024 * 1024  # bytes
    header_timeout: float = 10.0  # seconds a request's headers may take to arrive (the connection is closed after)
    body_timeout: float = 30.0  # seconds a request's body may take to arrive (408 after)
    stall_timeout: float = 60.0  # seconds a client may leave its answer unread before it is cancelled
    max_per_client: int = 0  # requests one client address may have open at once (0: no cap)
    max_tokens: int = 4096  # clamp
    default_max_tokens: int | None = None  # for requests that give none (None: the clamp)
    seed: int | None = None  # for requests that give none
    aliases: tuple[str, ...] = ()
    tool_format: str | None = None  # None: from the model's chat template
    fingerprint: str = ""
    history: object = None  # where stored Responses live: a path, ":memory:", or None (not stored)
    fault_after_tokens: int | None = None  # tests only: die by SIGSEGV at this many tokens (crash containment)
    media_urls: bool = False  # fetch http(s) media URLs in requests (serve --allow-media-urls)
    sampling: Sampling = Sampling()  # for the fields a request leaves out (a created model's preset)
    reasoning_budget: int | None = None  # for requests that set none (serve --reasoning-budget)
    stop: tuple[str, ...] = ()  # for requests that give no stop strings (a created model's preset)
    ui: bool = True  # the front answers GET / with the chat page (serve --no-ui: Ollama's liveness text only)
    conversations: object = None  # the history log the page keeps conversations in (None: logging is off)
    keys: str | None = None  # serve --auth keys: the database of keys and metered usage (serve/http/keys.py)
    journal: str | None = None  # the server's journal (serve/http/journal.py): what tallow logs --follow reads
    log_requests: bool = False  # serve --log-requests: the journal keeps each request's body (tallow logs --curl)
    port: int = 0  # the port served on, marked in the journal's records


_SERVER = ServerConfig(model="")


@dataclass(frozen=True)
class RunnerConfig:
    # the scheduler
    parallel: int = _SCHEDULER.parallel
    deterministic: bool = _SCHEDULER.deterministic
    kv_unified: bool = _SCHEDULER.kv_unified
    max_queue: int = _SCHEDULER.max_queue
    timeout: float | None = 600.0  # seconds a request may take (finish_reason "time_limit")
    draft: str | None = _SCHEDULER.draft
    # the load
    draft_files: tuple[str, ...] = ()  # the draft model's files (serve --draft MODEL for the first MODEL; draft=)
    draft_name: str | None = None  # ... and its name, as requests' "draft" and reports give it
    draft_max: int = 16
    draft_min: int = 0
    draft_p_min: float = 0.75
    ctx: int | None = None
    threads: int | None = None
    gpu_layers: str = "auto"
    device: str | None = None  # GPUs, comma-separated (serve --device; a model's device=)
    main_gpu: int = 0
    split_mode: str = "layer"
    tensor_split: str | None = None
    flash_attn: str = "auto"
    type_k: str = "f16"  # the KV cache's types (serve --cache-type-k/v, or per model)
    type_v: str = "f16"
    no_cache: bool = False
    mmproj: str | None = None  # the model's projector, for images in requests
    loras: tuple[tuple[str, float], ...] = ()  # LoRA adapters (path, default scale): serve --lora, lora=
    reasoning_budget: int | None = None  # serve --reasoning-budget: requests that set none get it
    media_urls: bool = False  # fetch http(s) media URLs (serve --allow-media-urls; never when offline)
    embed_batch: int = 512  # an embedding model's tokens per decode
    # the HTTP app
    max_tokens: int = _SERVER.max_tokens
    max_body: int = _SERVER.max_body
    default_max_tokens: int | None = _SERVER.default_max_tokens
    seed: int | None = _SERVER.seed
    tool_format: str | None = _SERVER.tool_format
    history: str | None = None
    usage: str | None = None  # serve --auth keys: where each request's usage is recorded (serve/http/usage.py)
    journal: str | None = None  # the server's journal, where each answer is recorded (serve/http/journal.py)
    port: int = 0  # the server's port, marked in the journal's records
    aliases: tuple[str, ...] = ()
    # a created model's preset (cli/presets.py, for_runner): its request defaults, and which
    # of the settings above serve was given (those the preset does not replace)
    sampling: dict[str, Any] = field(default_factory=dict)  # runtime.types.Sampling's fields
    stop: tuple[str, ...] = ()
    given: tuple[str, ...] = ()

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> RunnerConfig:
        """The config a server sent; a key this version does not know is an error, not ignored."""
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("the runner configuration must be a JSON object")
        unknown = sorted(set(data) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"unknown runner settings: {', '.join(unknown)}")
        if "loras" in data:
            data["loras"] = tuple((str(p), float(s)) for p, s in data["loras"])
        for key in ("aliases", "draft_files", "stop", "given"):
            if key in data:
                data[key] = tuple(data[key])
        return cls(**data)

    def with_options(self, options: dict[str, Any]) -> RunnerConfig:
        """This config with one model's own settings (serve --model-option) over it."""
        return replace(self, **options, given=tuple(sorted({*self.given, *options})))

    def scheduler(self) -> SchedulerSettings:
        return SchedulerSettings(parallel=self.parallel, deterministic=self.deterministic, kv_unified=self.kv_unified,
                                 max_queue=self.max_queue, max_tokens_cap=self.max_tokens, time_limit_s=self.timeout,
                                 draft=self.draft)

    def server(self, model: str, fingerprint: str, fault_after_tokens: int | None = None) -> ServerConfig:
        return ServerConfig(model=model, max_body=self.max_body, max_tokens=self.max_tokens,
                            default_max_tokens=self.default_max_tokens, seed=self.seed, aliases=self.aliases,
                            fingerprint=fingerprint, tool_format=self.tool_format, history=self.history,
                            fault_after_tokens=fault_after_tokens, media_urls=self.media_urls,
                            sampling=replace(Sampling(), **self.sampling), stop=self.stop,
                            reasoning_budget=self.reasoning_budget, journal=self.journal, port=self.port)
