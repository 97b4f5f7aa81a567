"""tallow serve's flags, by what they set: the listening socket and its guard, what a request
may do, the pool of runners, and Ray Serve (cli/flag_groups.py makes them flags of serve)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from tallow.cli import options as o
from tallow.cli.flag_groups import FlagGroup
from tallow.env import settings
from tallow.serve.config import RunnerConfig, ServerConfig

DEFAULT = RunnerConfig()
GUARD = ServerConfig(model="")


class ListenFlags(FlagGroup):
    """Where serve listens and who may ask it: address, keys, browsers, limits on connections."""

    host: Annotated[str, typer.Option("--host", help="Address to listen on; anything but loopback needs --api-key.")] = "127.0.0.1"
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="Port to listen on (0: any free port).")] = 8080
    api_key: Annotated[Optional[str], typer.Option("--api-key", help="Require 'Authorization: Bearer KEY' on every request (also TALLOW_API_KEY).", show_default=False)] = None
    auth: Annotated[Optional[str], typer.Option("--auth", help="'keys': every request needs a key made with tallow keys create, held to its models, routes and limits, and metered (tallow usage).", show_default=False)] = None
    cors: Annotated[Optional[list[str]], typer.Option("--cors", help="Allow browser requests from this origin (repeatable).", show_default=False)] = None
    max_body: Annotated[int, typer.Option("--max-body", min=1024, help="Largest request body in bytes (413 beyond).")] = DEFAULT.max_body
    header_timeout: Annotated[float, typer.Option("--header-timeout", callback=o.finite, min=0.1, help="Seconds a request's headers may take to arrive; a slower connection is closed.")] = GUARD.header_timeout
    body_timeout: Annotated[float, typer.Option("--body-timeout", callback=o.finite, min=0.1, help="Seconds a request's body may take to arrive (408 after).")] = GUARD.body_timeout
    max_per_client: Annotated[int, typer.Option("--max-per-client", min=0, help="Requests one client address may have open at once; more get 429 (0: no cap).")] = GUARD.max_per_client
    stall_timeout: Annotated[float, typer.Option("--stall-timeout", callback=o.finite, min=0.1, help="Seconds a client may leave its streamed answer unread; then the request is cancelled and its slot freed.")] = GUARD.stall_timeout
    drain_timeout: Annotated[float, typer.Option("--drain-timeout", callback=o.finite, min=0.0, help="On SIGTERM: seconds the requests in flight may take to finish (new ones get 503), then exit 0.")] = 30.0
    no_ui: Annotated[bool, typer.Option("--no-ui", help="Answer GET / with the liveness text only, not the chat page.")] = False
    open_page: Annotated[bool, typer.Option("--open", help="Open the chat page in the browser once serving.")] = False
    mcp: Annotated[Optional[Path], typer.Option("--mcp", help="Let the chat page offer the tools of the MCP servers in this mcpServers JSON file, each call approved in the page (the APIs never run tools).", show_default=False)] = None
    log_requests: Annotated[bool, typer.Option("--log-requests", help="Keep each request's body in the journal, so that tallow logs --curl ID can replay it (never a key or a header).")] = False

    def key(self) -> str | None:
        return self.api_key or settings.api_key()

    def keys_db(self) -> str | None:
        """The keys' database with --auth keys (tallow keys writes it), else None."""
        return str(settings.history_path()) if self.auth == "keys" else None

    def check(self) -> None:
        """The combinations that cannot work, refused by name before anything loads."""
        from tallow.common.net import is_loopback

        if self.open_page and self.no_ui:
            raise typer.BadParameter("there is no page to open with --no-ui", param_hint="--open")
        if self.mcp is not None and self.no_ui:
            raise typer.BadParameter("--mcp gives the chat page its tools, and --no-ui leaves the page out",
                                     param_hint="--mcp")
        if self.auth not in (None, "keys"):
            raise typer.BadParameter(f"'{self.auth}' is not a kind of authentication tallow knows (keys)",
                                     param_hint="--auth")
        if self.auth == "keys" and self.key():
            raise typer.BadParameter("--auth keys checks the keys of tallow keys; make one with --routes "
                                     "generate,embed,admin there instead of --api-key (or TALLOW_API_KEY)",
                                     param_hint="--auth")
        if not is_loopback(self.host) and not self.key() and self.keys_db() is None:
            raise typer.BadParameter(f"listening on {self.host} exposes the server beyond this machine; give "
                                     "--api-key or --auth keys (or TALLOW_API_KEY)", param_hint="--host")

    def guard(self, model: str, history: str) -> ServerConfig:
        """The front's guard settings."""
        return ServerConfig(model=model, host=self.host, api_key=self.key(), cors=tuple(self.cors or ()),
                            max_body=self.max_body, history=history, ui=not self.no_ui, keys=self.keys_db(),
                            body_timeout=self.body_timeout, stall_timeout=self.stall_timeout,
                            max_per_client=self.max_per_client, log_requests=self.log_requests,
                            conversations=str(settings.history_path()) if settings.logging_enabled() else None)


class RequestFlags(FlagGroup):
    """What each request may do and gets by default."""

    parallel: o.Parallel = DEFAULT.parallel
    max_tokens: Annotated[int, typer.Option("--max-tokens", min=1, help="Clamp on a request's max_tokens.")] = DEFAULT.max_tokens
    default_max_tokens: Annotated[Optional[int], typer.Option("--default-max-tokens", min=1, help="max_tokens for requests that give none (default: the --max-tokens clamp).", show_default=False)] = None
    max_queue: Annotated[int, typer.Option("--max-queue", min=0, help="Requests that may wait for a slot, per model; more get 503.")] = DEFAULT.max_queue
    timeout: Annotated[Optional[float], typer.Option("--timeout", callback=o.finite, min=0.01, help="Seconds a request may take (finish_reason 'time_limit').")] = DEFAULT.timeout
    seed: o.ServeSeed = None
    reasoning_budget: o.ReasoningBudget = None
    tool_format: o.ToolFormat = "auto"
    deterministic: o.Deterministic = False
    kv_unified: o.KvUnified = False
    no_cache: o.NoCache = False
    allow_media_urls: Annotated[bool, typer.Option("--allow-media-urls", help="Fetch http(s) image URLs that requests name (10 s, 20 MB each): the server then requests any address a client gives it.")] = False


class ServedFiles(FlagGroup):
    """The first MODEL's projector and adapters."""

    mmproj: Annotated[Optional[Path], typer.Option("--mmproj", help="The projector (mmproj GGUF) of the one MODEL: requests may then hold images.", show_default=False)] = None
    lora: Annotated[Optional[list[str]], typer.Option("--lora", help="A LoRA adapter (GGUF) for the first MODEL, FILE or FILE:SCALE (repeatable); requests pick scales with 'lora' and POST /lora-adapters.", show_default=False)] = None
    alias: Annotated[Optional[list[str]], typer.Option("--alias", help="Answer to this model name too (repeatable), for clients that hard-code one; it names the first MODEL.", show_default=False)] = None

    def check(self, models: list[str]) -> None:
        if self.mmproj is not None and (len(models) != 1 or not self.mmproj.is_file()):
            raise typer.BadParameter("names no projector file" if len(models) == 1 else
                                     "a projector goes with exactly one MODEL", param_hint="--mmproj")


class PoolFlags(FlagGroup):
    """The runners: how many models stay loaded, in how much memory, for how long."""

    max_models: Annotated[int, typer.Option("--max-models", min=1, help="Models loaded at once; loading one more unloads the least recently used idle one.")] = 3
    memory_budget: Annotated[Optional[str], typer.Option("--memory-budget", help="Memory the loaded models may take in all (e.g. 8GB) [default: what is free].", show_default=False)] = None
    keep_alive: Annotated[Optional[str], typer.Option("--keep-alive", help="How long an idle model stays loaded: 5m, 1h, 30s, 0 (unload at once), -1 (forever) [default: TALLOW_KEEP_ALIVE or 5m].", show_default=False)] = None
    model_option: Annotated[Optional[list[str]], typer.Option("--model-option", help="Per-model settings: 'MODEL parallel=N ctx=N gpu_layers=auto|all|N device=GPU,... draft=MODEL|lookup cache_type_k=T cache_type_v=T lora=FILE[:SCALE]' (repeatable).", show_default=False)] = None

    def budget(self) -> int | None:
        if self.memory_budget is None:
            return None
        budget = settings.parse_size(self.memory_budget)
        if not budget:
            raise typer.BadParameter("give a size such as 8GB or 512MiB", param_hint="--memory-budget")
        return budget


class RayServeFlags(FlagGroup):
    """serve --ray: the one MODEL as a Ray Serve application."""

    ray: Annotated[Optional[str], typer.Option("--ray", help="Serve the one MODEL on a Ray cluster with Ray Serve: local, auto, or the head's address. Needs tallow[ray].", show_default=False)] = None
    ray_replicas: Annotated[int, typer.Option("--ray-replicas", min=0, help="With --ray: replicas of the model, one engine each (0: as many as the cluster's CPUs hold).")] = 0
    ray_cpus_per_replica: Annotated[int, typer.Option("--ray-cpus-per-replica", min=1, help="With --ray: CPUs each replica reserves; its engine's threads.")] = 1
    ray_weights: Annotated[str, typer.Option("--ray-weights", help="With --ray: how nodes get the weights: path, ship, or auto (as tallow batch --ray).")] = "auto"
