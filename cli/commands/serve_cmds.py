"""tallow serve: the HTTP front over runner processes, one per loaded model (serve/front/front_app.py)."""

from __future__ import annotations

import errno
import os
import socket
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Optional

import typer

from tallow.cli import options as o
from tallow.cli import presets
from tallow.cli.render import err_console
from tallow.common.errors import TallowError
from tallow.env import settings
from tallow.serve.config import RunnerConfig, ServerConfig

GUARD = ServerConfig(model="")  # the front's defaults
DEFAULT = RunnerConfig()  # serve's defaults, defined once (serve/config.py); the options show them


@presets.knows_given
def serve(
    models: Optional[list[str]] = typer.Argument(None, help="Models to load at start (default: none; every stored model is served on demand).", show_default=False, autocompletion=o.complete_model),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on; anything but loopback needs --api-key."),
    port: int = typer.Option(8080, "--port", min=0, max=65535, help="Port to listen on (0: any free port)."),
    parallel: o.Parallel = DEFAULT.parallel,
    api_key: Optional[str] = typer.Option(None, "--api-key", help="Require 'Authorization: Bearer KEY' on every request (also TALLOW_API_KEY).", show_default=False),
    auth: Optional[str] = typer.Option(None, "--auth", help="'keys': every request needs a key made with tallow keys create, held to its models, routes and limits, and metered (tallow usage).", show_default=False),
    cors: Optional[list[str]] = typer.Option(None, "--cors", help="Allow browser requests from this origin (repeatable).", show_default=False),
    max_tokens: int = typer.Option(DEFAULT.max_tokens, "--max-tokens", min=1, help="Clamp on a request's max_tokens."),
    max_queue: int = typer.Option(DEFAULT.max_queue, "--max-queue", min=0, help="Requests that may wait for a slot, per model; more get 503."),
    timeout: float = typer.Option(DEFAULT.timeout, "--timeout", callback=o.finite, min=0.01, help="Seconds a request may take (finish_reason 'time_limit')."),
    max_body: int = typer.Option(DEFAULT.max_body, "--max-body", min=1024, help="Largest request body in bytes (413 beyond)."),
    header_timeout: float = typer.Option(GUARD.header_timeout, "--header-timeout", callback=o.finite, min=0.1, help="Seconds a request's headers may take to arrive; a slower connection is closed."),
    body_timeout: float = typer.Option(GUARD.body_timeout, "--body-timeout", callback=o.finite, min=0.1, help="Seconds a request's body may take to arrive (408 after)."),
    max_per_client: int = typer.Option(GUARD.max_per_client, "--max-per-client", min=0, help="Requests one client address may have open at once; more get 429 (0: no cap)."),
    stall_timeout: float = typer.Option(GUARD.stall_timeout, "--stall-timeout", callback=o.finite, min=0.1, help="Seconds a client may leave its streamed answer unread; then the request is cancelled and its slot freed."),
    deterministic: o.Deterministic = False,
    kv_unified: o.KvUnified = False,
    ctx: o.Ctx = None,
    threads: o.Threads = None,
    gpu_layers: o.GpuLayers = "auto",
    device: o.Device = None,
    main_gpu: o.MainGpu = 0,
    split_mode: o.SplitMode = "layer",
    tensor_split: o.TensorSplit = None,
    flash_attn: o.FlashAttn = "auto",
    cache_type_k: o.CacheTypeK = "f16",
    cache_type_v: o.CacheTypeV = "f16",
    draft: o.Draft = None,
    draft_max: o.DraftMax = 16,
    draft_min: o.DraftMin = 0,
    draft_p_min: o.DraftPMin = 0.75,
    no_cache: o.NoCache = False,
    mmproj: Optional[Path] = typer.Option(None, "--mmproj", help="The projector (mmproj GGUF) of the one MODEL: requests may then hold images.", show_default=False),
    lora: Optional[list[str]] = typer.Option(None, "--lora", help="A LoRA adapter (GGUF) for the first MODEL, FILE or FILE:SCALE (repeatable); requests pick scales with 'lora' and POST /lora-adapters.", show_default=False),
    allow_media_urls: bool = typer.Option(False, "--allow-media-urls", help="Fetch http(s) image URLs that requests name (10 s, 20 MB each): the server then requests any address a client gives it."),
    alias: Optional[list[str]] = typer.Option(None, "--alias", help="Answer to this model name too (repeatable), for clients that hard-code one; it names the first MODEL.", show_default=False),
    reasoning_budget: o.ReasoningBudget = None,
    seed: Optional[int] = typer.Option(None, "--seed", min=0, help="Seed for requests that give none (default: a fresh one each).", show_default=False),
    default_max_tokens: Optional[int] = typer.Option(None, "--default-max-tokens", min=1, help="max_tokens for requests that give none (default: the --max-tokens clamp).", show_default=False),
    tool_format: o.ToolFormat = "auto",
    max_models: int = typer.Option(3, "--max-models", min=1, help="Models loaded at once; loading one more unloads the least recently used idle one."),
    memory_budget: Optional[str] = typer.Option(None, "--memory-budget", help="Memory the loaded models may take in all (e.g. 8GB) [default: what is free].", show_default=False),
    keep_alive: Optional[str] = typer.Option(None, "--keep-alive", help="How long an idle model stays loaded: 5m, 1h, 30s, 0 (unload at once), -1 (forever) [default: TALLOW_KEEP_ALIVE or 5m].", show_default=False),
    model_option: Optional[list[str]] = typer.Option(None, "--model-option", help="Per-model settings: 'MODEL parallel=N ctx=N gpu_layers=auto|all|N device=GPU,... draft=MODEL|lookup cache_type_k=T cache_type_v=T lora=FILE[:SCALE]' (repeatable).", show_default=False),
    drain_timeout: float = typer.Option(30.0, "--drain-timeout", callback=o.finite, min=0.0, help="On SIGTERM: seconds the requests in flight may take to finish (new ones get 503), then exit 0."),
    no_ui: bool = typer.Option(False, "--no-ui", help="Answer GET / with the liveness text only, not the chat page."),
    open_page: bool = typer.Option(False, "--open", help="Open the chat page in the browser once serving."),
    offline: o.Offline = False,
    ray: Optional[str] = typer.Option(None, "--ray", help="Serve the one MODEL on a Ray cluster with Ray Serve: local, auto, or the head's address. Needs tallow[ray].", show_default=False),
    ray_replicas: int = typer.Option(0, "--ray-replicas", min=0, help="With --ray: replicas of the model, one engine each (0: as many as the cluster's CPUs hold)."),
    ray_cpus_per_replica: int = typer.Option(1, "--ray-cpus-per-replica", min=1, help="With --ray: CPUs each replica reserves; its engine's threads."),
    ray_weights: str = typer.Option("auto", "--ray-weights", help="With --ray: how nodes get the weights: path, ship, or auto (as tallow batch --ray)."),
) -> None:
    """Serve models over HTTP: OpenAI, Anthropic and Ollama APIs.

    Each loaded model runs in a runner process of its own; a request that names a stored
    model loads it. POST /v1/chat/completions, /v1/completions, /v1/responses, /v1/messages,
    /api/chat and /api/generate (streamed or whole, with tools); GET /v1/models, /api/tags,
    /api/ps, /health, /ready and /metrics (Prometheus); GET / in a browser is a chat page.
    SIGTERM drains, then exits 0.

    \b
    With --ray, the one MODEL is a Ray Serve application on a cluster instead: replicas of
    it on the nodes, requests sharing a prompt prefix routed to the same replica.

    \b
    Examples:
      tallow serve smollm2:135m --port 8080 --parallel 4
      tallow serve --max-models 2 --keep-alive 10m
      tallow serve smollm2:135m --ray auto --ray-replicas 4
    """
    from tallow.common.net import is_loopback
    from tallow.serve.front.front_app import FrontConfig, create_front
    from tallow.serve.http.replica import Replica

    forced_format = o.parse_tool_format(tool_format)
    if open_page and no_ui:
        raise typer.BadParameter("there is no page to open with --no-ui", param_hint="--open")
    key = api_key or settings.api_key()
    if auth not in (None, "keys"):
        raise typer.BadParameter(f"'{auth}' is not a kind of authentication tallow knows (keys)", param_hint="--auth")
    if auth == "keys" and key:
        raise typer.BadParameter("--auth keys checks the keys of tallow keys; make one with --routes "
                                 "generate,embed,admin there instead of --api-key (or TALLOW_API_KEY)", param_hint="--auth")
    keys_db = str(settings.history_path()) if auth == "keys" else None
    if not is_loopback(host) and not key and keys_db is None:
        raise typer.BadParameter(f"listening on {host} exposes the server beyond this machine; give --api-key or --auth keys "
                                 "(or TALLOW_API_KEY)", param_hint="--host")
    drafts = _Drafts(offline or settings.offline(), (draft_max, draft_min, draft_p_min))
    draft_files, draft_name = drafts.files(draft, models[0] if models else None)
    if allow_media_urls and (offline or settings.offline()):
        raise typer.BadParameter("fetching URLs needs the network, and offline mode is on", param_hint="--allow-media-urls")
    if mmproj is not None and (len(models or []) != 1 or not mmproj.is_file()):
        raise typer.BadParameter("names no projector file" if len(models or []) == 1 else
                                 "a projector goes with exactly one MODEL", param_hint="--mmproj")
    keep = _keep_alive(keep_alive if keep_alive is not None else settings.keep_alive())
    budget = None
    if memory_budget is not None:
        budget = settings.parse_size(memory_budget)
        if not budget:
            raise typer.BadParameter("give a size such as 8GB or 512MiB", param_hint="--memory-budget")
    cache_type_k, cache_type_v, flash_attn = o.cache_types(cache_type_k, cache_type_v, flash_attn)
    per_model = _model_options(model_option or [], drafts, (cache_type_k, cache_type_v, flash_attn))
    drafts.check_limits(draft)
    place = o.placement(device, main_gpu, split_mode, tensor_split)  # checked here; each runner makes its own
    if place.devices:
        from tallow.runtime.host.devices import gpu_handles

        gpu_handles(place.devices)  # an unknown device: one line now, not a runner that fails later
    ray_opts = _ray_options(ray, ray_replicas, ray_cpus_per_replica, ray_weights, offline, models or [], {
        "--auth": auth is not None, "--threads": threads is not None, "--max-models": max_models != 3,
        "--memory-budget": memory_budget is not None, "--keep-alive": keep_alive is not None,
        "--model-option": bool(model_option), "--open": open_page, "--max-per-client": max_per_client != GUARD.max_per_client,
        "--header-timeout": header_timeout != GUARD.header_timeout})

    def runner_base(history: str | None) -> RunnerConfig:
        return RunnerConfig(parallel=parallel, ctx=ctx, threads=threads, gpu_layers=o.parse_gpu_layers(gpu_layers),
                            device=device, main_gpu=main_gpu, split_mode=split_mode, tensor_split=tensor_split,
                            flash_attn=flash_attn, type_k=cache_type_k, type_v=cache_type_v,
                            draft=o.parse_draft(draft), draft_files=draft_files,
                            draft_name=draft_name,
                            draft_max=draft_max, draft_min=draft_min, draft_p_min=draft_p_min, deterministic=deterministic,
                            kv_unified=kv_unified, max_queue=max_queue, max_tokens=max_tokens, timeout=timeout,
                            max_body=max_body, no_cache=no_cache, seed=seed, default_max_tokens=default_max_tokens,
                            tool_format=forced_format, history=history,
                            mmproj=str(mmproj.resolve()) if mmproj is not None else None, media_urls=allow_media_urls,
                            given=presets.given_fields(), loras=_lora_config(o.loras(lora)),
                            reasoning_budget=reasoning_budget, usage=keys_db)

    if ray_opts is not None:
        from tallow.cli.ray.serve import Front, serve_on_ray

        serve_on_ray(ray_opts, (models or [""])[0], replace(runner_base(None), aliases=tuple(alias or ())),
                     Front(host, port, key, tuple(cors or ()), drain_timeout), offline)
        return
    sock = _listen(host, port)  # before loading: a taken port fails fast
    with tempfile.TemporaryDirectory(prefix="tallow-serve-") as private:
        history = str(settings.history_path()) if settings.logging_enabled() else os.path.join(private, "responses.db")
        base = runner_base(history)
        pool, registry, names = _start_pool(models or [], base, per_model, private, max_models, budget, keep, offline,
                                           tuple(alias or ()))
        try:
            from importlib.metadata import version

            guard = ServerConfig(model=names[0] if names else "", host=host, api_key=key, cors=tuple(cors or ()),
                                 max_body=max_body, history=history, ui=not no_ui, keys=keys_db,
                                 body_timeout=body_timeout, stall_timeout=stall_timeout, max_per_client=max_per_client,
                                 conversations=str(settings.history_path()) if settings.logging_enabled() else None)
            replica = Replica()
            app = create_front(pool, registry, FrontConfig(guard, names[0] if names else None, version("tallow")), replica)

            def start() -> None:  # while the server already answers /health and /ready (not ready yet)
                _preload(pool, names)
                replica.started()
                bound = sock.getsockname()
                shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
                what = ", ".join(_loaded_line(r) for r in pool.loaded()) or "every stored model, loaded on demand"
                err_console().print(f"serving {what} on http://{shown}:{bound[1]}", soft_wrap=True)
                if open_page:
                    from tallow.cli.commands.ui_cmds import open_browser

                    open_browser(f"http://{'localhost' if is_loopback(host) else shown}:{bound[1]}/", names[:1])

            run_uvicorn(app, sock, start, replica, drain_timeout, header_timeout)
        finally:
            pool.close()


def _ray_options(address: str | None, replicas: int, cpus: int, weights: str, offline: bool, models: list[str],
                 front_only: dict[str, bool]):
    """--ray's settings checked (None without --ray, whose other flags are then refused); the
    flags of the multi-model front have no meaning on Ray Serve and are refused by name."""
    from tallow.cli.ray.connect import checked_options

    opts = checked_options(address, replicas, cpus, weights, offline or settings.offline(),
                           ("--ray-replicas", "--ray-cpus-per-replica"), "replicas")
    if opts is None:
        return None
    if len(models) != 1:
        raise typer.BadParameter("serve --ray serves one MODEL: name it (run one serve --ray per model)",
                                 param_hint="--ray")
    for flag, used in front_only.items():
        if used:
            raise typer.BadParameter("this is not available with --ray (Ray Serve runs the replicas)", param_hint=flag)
    return opts


class _Drafts:
    """Draft models named at start (--draft, a model's draft=): found, or pulled, now; a
    runner loads its own."""

    def __init__(self, offline: bool, limits: tuple[int, int, float]) -> None:
        self.offline, self.limits, self.named = offline, limits, 0

    def files(self, draft: str | None, target: str | None) -> tuple[tuple[str, ...], str | None]:
        """The files and name of the draft for `target` (--draft auto picks one, or none)."""
        if draft in (None, "lookup"):
            return (), None
        if draft == "auto" and target is None:
            raise typer.BadParameter("--draft auto picks a draft for the first MODEL: give one", param_hint="--draft")
        from tallow.runtime.types import LoadSettings

        self.named += 1
        load = o.draft_model(LoadSettings(), draft, self.offline, *self.limits, target=target or "")
        return tuple(str(p) for p in load.draft), load.draft_name

    def option(self, value: str, target: str) -> dict:
        """A model's draft= option as its runner's settings."""
        files, name = self.files(value, target)
        return {"draft": o.parse_draft(value), "draft_files": files, "draft_name": name}

    def check_limits(self, draft: str | None) -> None:
        """--draft-max and the others need a draft model somewhere (o.draft_model says it)."""
        if not self.named:
            o.draft_model(None, draft, self.offline, *self.limits)


def _loaded_line(r) -> str:
    info = r.info
    if info.get("pooling"):  # an embedding model or a reranker (serve/runner/embed_routes.py)
        kind = "reranker" if info["pooling"] == "rank" else f"embeddings, {info['pooling']} pooling"
        return f"{r.name} ({kind}, {info.get('parallel')} inputs per decode, {info.get('capacity')} tokens per input)"
    per = " shared" if info.get("unified") else f", {info.get('capacity')} per request"
    return f"{r.name} ({info.get('parallel')} parallel, context {info.get('n_ctx')}{per})"


def _keep_alive(text: str) -> float | None:
    from tallow.serve.front.pool import parse_keep_alive

    try:
        return parse_keep_alive(text)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--keep-alive") from exc


def _lora_config(specs) -> tuple[tuple[str, float], ...]:
    return tuple((str(s.path), s.scale) for s in specs)


def _model_options(values: list[str], drafts: _Drafts, kv: tuple[str, str, str]) -> dict[str, dict]:
    """Each --model-option's settings, checked; `kv`: serve's own KV types and flash attention."""
    out: dict[str, dict] = {}
    for value in values:
        name, *pairs = value.split()
        opts: dict = {}
        for pair in pairs:
            k, _, v = pair.partition("=")
            if k == "draft" and v:
                opts.update(drafts.option(v, name))
                continue
            if k in ("cache_type_k", "cache_type_v") and v:
                opts["type_" + k[-1]] = v
                continue
            if k == "lora" and v:
                opts["loras"] = opts.get("loras", ()) + _lora_config(o.loras([v], "--model-option"))
                continue
            if k == "gpu_layers" and (v in ("auto", "all") or v.isdigit()):
                opts[k] = v
                continue
            if k == "device" and v:
                o.placement(v)  # its form; whether the devices exist, the runner's load says
                opts[k] = v
                continue
            if k not in ("parallel", "ctx") or not v.isdigit() or int(v) < 1:
                raise typer.BadParameter(f"{pair!r}: use parallel=N, ctx=N (whole numbers), gpu_layers=auto|all|N, "
                                         "device=NAMES, draft=MODEL|lookup, cache_type_k=TYPE, cache_type_v=TYPE or "
                                         "lora=FILE[:SCALE]",
                                         param_hint="--model-option")
            opts[k] = int(v)
        if "type_k" in opts or "type_v" in opts:
            kv_types = o.cache_types(opts.get("type_k", kv[0]), opts.get("type_v", kv[1]), kv[2], f" for {name}")
            opts.update(type_k=kv_types[0], type_v=kv_types[1], flash_attn=kv_types[2])
        if not opts:
            raise typer.BadParameter(f"{value!r} sets nothing: write 'MODEL parallel=N ctx=N gpu_layers=N'",
                                     param_hint="--model-option")
        out[name] = opts
    return out


def _start_pool(models: list[str], base: RunnerConfig, per_model: dict, private: str, max_models: int, budget, keep,
                offline: bool, aliases: tuple[str, ...]):
    """The runner pool and the registry, with the models named at start found (pulled first
    if they are known but not stored, as `tallow run` does); `_preload` loads them."""
    from dataclasses import replace

    from tallow.cli.models import find_model, pull_options, store
    from tallow.models.memory import available_memory
    from tallow.models.refs import PathRef, parse_ref
    from tallow.serve.front.pool import Pool, PoolSettings
    from tallow.serve.front.registry import Registry

    if len(models) > max_models:
        raise typer.BadParameter(f"{len(models)} models named but --max-models is {max_models}", param_hint="--max-models")
    st = store()
    locals_ = [find_model(m, offline) for m in models]
    files = {lm.name: lm for m, lm in zip(models, locals_) if isinstance(parse_ref(m), PathRef)}
    names = [lm.name for lm in locals_]
    alias_map = {a: names[0] for a in aliases} if names else {}
    if aliases and not names:
        raise typer.BadParameter("--alias names the first MODEL: give one", param_hint="--alias")
    if names:
        alias_map["tallow"] = names[0]
    registry = Registry(st, files, lambda: pull_options(offline), alias_map,
                        {names[0]: Path(base.mmproj)} if base.mmproj and names else {})
    for m in per_model:
        registry.find(m)  # a bad name fails at start, not at the first request

    def config_for(name: str) -> RunnerConfig:
        # --mmproj and --draft MODEL are the first MODEL's
        conf = base if name == (names or [None])[0] else replace(base, mmproj=None, draft_files=(), draft_name=None, loras=(),
                                                                 draft=None if base.draft_files else base.draft)
        for key, opts in per_model.items():
            if registry.find(key).name == name:
                conf = conf.with_options(opts)
        return presets.for_runner(conf, registry.find(name).preset)

    def args_for(name: str) -> list[str]:
        return ["--config", config_for(name).to_json()]

    def runner_model(name: str) -> str:
        local = registry.find(name)
        return str(local.path) if local.name in files else local.name

    pool = Pool(PoolSettings(command=[sys.executable, "-m", "tallow.cli", "runner"], args_for=args_for,
                             socket_dir=Path(private), max_models=max_models, budget=budget, keep_alive=keep,
                             model_arg=runner_model),
                lambda name: _need(registry.find(name), config_for(name)), available_memory, _log)
    return pool, registry, names


def _preload(pool, names: list[str]) -> None:
    """Load the models named at start, kept loaded until a request says otherwise."""
    for name in names:
        runner, _ = pool.acquire(name, pinned=True)
        pool.release(runner)


def _need(local, conf: RunnerConfig):
    """The fit check's estimate of a load (weights, and the projector a runner will load), without loading it."""
    from dataclasses import replace

    from tallow.runtime.host.devices import gpu_free_memory
    from tallow.runtime.loadplan import plan_memory
    from tallow.serve.front.pool import Need

    load = o.load_settings(conf.ctx, conf.threads, conf.gpu_layers, conf.flash_attn, conf.type_k, conf.type_v)
    load = replace(load, n_seq_max=conf.parallel, mmproj=local.mmproj)
    vram = gpu_free_memory()
    plan = plan_memory(local.paths, load, offload_supported=vram is not None, vram=vram)
    return Need(plan.estimate.ram, plan.estimate.vram, plan.problem.message if plan.problem else None)


def _log(line: str) -> None:
    err_console().print(line, soft_wrap=True, markup=False, highlight=False)


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except socket.gaierror as exc:
        sock.close()
        raise TallowError(f"cannot listen on {host}: {exc.strerror or exc}", "give --host an IP address") from exc
    except OSError as exc:
        sock.close()
        hint = {errno.EADDRINUSE: "pick another --port, or stop what uses it",
                errno.EADDRNOTAVAIL: f"{host} is not an address of this machine: use 127.0.0.1, 0.0.0.0 (every "
                                     "interface) or one of its own addresses",
                errno.EACCES: "ports below 1024 need privileges: pick a --port above 1023"}.get(exc.errno or 0)
        raise TallowError(f"cannot listen on {host}:{port}: {exc.strerror or exc}", hint) from exc
    sock.listen(128)
    return sock


def run_uvicorn(app, sock: socket.socket, start=None, replica=None, drain_s: float = 30.0,
                header_s: float = GUARD.header_timeout) -> None:
    """Serve `app` on `sock` until a signal stops it. `start` runs in a thread once the loop
    is about to answer (its exception ends the server and is raised here). With a `replica`
    (serve/http/replica.py), SIGTERM drains: new requests get 503 while those in flight finish, for
    up to `drain_s` seconds, then this returns (exit 0); a second SIGTERM, or Ctrl-C, stops at once."""
    import signal
    import threading

    import uvicorn

    class Server(uvicorn.Server):
        drained = False

        def handle_exit(self, sig, frame) -> None:
            if replica is None or sig != signal.SIGTERM or replica.draining:
                return super().handle_exit(sig, frame)
            replica.drain()
            threading.Thread(target=self.finish_drain, name="tallow-drain", daemon=True).start()

        def finish_drain(self) -> None:
            replica.wait_idle(drain_s)
            self.drained = True
            self.should_exit = True

    from tallow.serve.http.header_timeout import with_header_timeout

    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=5,
                            http=with_header_timeout(header_s))
    server = Server(config)
    failed: list[BaseException] = []
    if start is not None:
        def starter() -> None:
            try:
                start()
            except BaseException as exc:  # noqa: BLE001 - raised again on the main thread
                failed.append(exc)
                server.should_exit = True

        threading.Thread(target=starter, name="tallow-start", daemon=True).start()
    server.run(sockets=[sock])
    if failed:
        raise failed[0]
    if server.drained:
        return
    if server.should_exit:
        # uvicorn takes Ctrl-C itself and returns after a graceful shutdown (newer versions
        # raise the signal again afterwards, older ones do not): either way it is an
        # interrupt, exit 130, as for every other command.
        raise KeyboardInterrupt
