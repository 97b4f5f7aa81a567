"""tallow serve: the HTTP front over runner processes, one per loaded model (serve/front/front_app.py)."""

from __future__ import annotations

import errno
import functools
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
from tallow.cli.commands.serve_flags import GUARD, ListenFlags, PoolFlags, RayServeFlags, RequestFlags, ServedFiles
from tallow.cli.flag_groups import DraftFlags, LoadFlags, with_groups
from tallow.cli.render import err_console
from tallow.common.errors import TallowError
from tallow.env import settings
from tallow.serve.config import RunnerConfig


@presets.knows_given
@with_groups(listen=ListenFlags, asks=RequestFlags, load=LoadFlags, drafting=DraftFlags, files=ServedFiles,
             pool=PoolFlags, on_ray=RayServeFlags)
def serve(
    models: Optional[list[str]] = typer.Argument(None, help="Models to load at start (default: none; every stored model is served on demand).", show_default=False, autocompletion=o.complete_model),
    offline: o.Offline = False,
    *, listen: ListenFlags, asks: RequestFlags, load: LoadFlags, drafting: DraftFlags, files: ServedFiles,
    pool: PoolFlags, on_ray: RayServeFlags,
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
    models = models or []
    listen.check()
    offline = offline or settings.offline()
    drafts = _Drafts(offline, (drafting.draft_max, drafting.draft_min, drafting.draft_p_min))
    draft = drafts.files(drafting.draft, models[0] if models else None)
    if asks.allow_media_urls and offline:
        raise typer.BadParameter("fetching URLs needs the network, and offline mode is on", param_hint="--allow-media-urls")
    files.check(models)
    keep = _keep_alive(pool.keep_alive if pool.keep_alive is not None else settings.keep_alive())
    kv = o.cache_types(load.cache_type_k, load.cache_type_v, load.flash_attn)
    per_model = _model_options(pool.model_option or [], drafts, kv)
    drafts.check_limits(drafting.draft)
    _check_devices(load)
    ray_opts = _ray_options(on_ray, offline, models, {
        "--auth": listen.auth is not None, "--threads": load.threads is not None, "--max-models": pool.max_models != 3,
        "--memory-budget": pool.memory_budget is not None, "--keep-alive": pool.keep_alive is not None,
        "--model-option": bool(pool.model_option), "--open": listen.open_page, "--mcp": listen.mcp is not None,
        "--max-per-client": listen.max_per_client != GUARD.max_per_client,
        "--header-timeout": listen.header_timeout != GUARD.header_timeout})
    base = functools.partial(_runner_base, listen, asks, load, drafting, files, kv, draft)
    if ray_opts is not None:
        from tallow.cli.ray.serve import Front, serve_on_ray

        serve_on_ray(ray_opts, models[0], replace(base(None), aliases=tuple(files.alias or ())),
                     Front(listen.host, listen.port, listen.key(), tuple(listen.cors or ()), listen.drain_timeout),
                     offline)
        return
    _serve_front(models, listen, pool, base, per_model, offline, keep, tuple(files.alias or ()))


def _runner_base(listen: ListenFlags, asks: RequestFlags, load: LoadFlags, drafting: DraftFlags, files: ServedFiles,
                 kv: tuple[str, str, str], draft: tuple, history: str | None) -> RunnerConfig:
    """Every runner's settings from serve's flags (a model's preset and --model-option go over them)."""
    return RunnerConfig(parallel=asks.parallel, ctx=load.ctx, threads=load.threads,
                        gpu_layers=o.parse_gpu_layers(load.gpu_layers), device=load.device, main_gpu=load.main_gpu,
                        split_mode=load.split_mode, tensor_split=load.tensor_split, flash_attn=kv[2], type_k=kv[0],
                        type_v=kv[1], draft=drafting.method(), draft_files=draft[0], draft_name=draft[1],
                        draft_max=drafting.draft_max, draft_min=drafting.draft_min, draft_p_min=drafting.draft_p_min,
                        deterministic=asks.deterministic, kv_unified=asks.kv_unified, max_queue=asks.max_queue,
                        max_tokens=asks.max_tokens, timeout=asks.timeout, max_body=listen.max_body,
                        no_cache=asks.no_cache, seed=asks.seed, default_max_tokens=asks.default_max_tokens,
                        tool_format=o.parse_tool_format(asks.tool_format), history=history,
                        mmproj=str(files.mmproj.resolve()) if files.mmproj is not None else None,
                        media_urls=asks.allow_media_urls, given=presets.given_fields(),
                        loras=_lora_config(o.loras(files.lora)), reasoning_budget=asks.reasoning_budget,
                        usage=listen.keys_db())


def _check_devices(load: LoadFlags) -> None:
    """--device and the rest checked here (each runner makes its own placement); an unknown
    device is one line now, not a runner that fails later."""
    place = o.placement(load.device, load.main_gpu, load.split_mode, load.tensor_split)
    if place.devices:
        from tallow.runtime.host.devices import gpu_handles

        gpu_handles(place.devices)


def _serve_front(models: list[str], listen: ListenFlags, pool_flags: PoolFlags, base, per_model: dict, offline: bool,
                 keep, aliases: tuple[str, ...]) -> None:
    """The multi-model front on its socket, its runners started, until SIGTERM or Ctrl-C."""
    from importlib.metadata import version

    from tallow.cli.mcp_tools import open_hub
    from tallow.runtime.host.threads import physical_cores
    from tallow.serve.front.front_app import FrontConfig, create_front
    from tallow.serve.http.replica import Replica

    sock = _listen(listen.host, listen.port)  # before loading: a taken port fails fast
    with tempfile.TemporaryDirectory(prefix="tallow-serve-") as private:
        history = str(settings.history_path()) if settings.logging_enabled() else os.path.join(private, "responses.db")
        journal = {"journal": str(settings.journal_path()), "port": sock.getsockname()[1]}
        conf = replace(base(history), **journal)
        pool, registry, names = _start_pool(models, conf, per_model, private, pool_flags.max_models,
                                           pool_flags.budget(), keep, offline, aliases)
        _start_recheck(pool, conf.threads)
        tools = None
        try:
            tools = open_hub(listen.mcp, offline) if listen.mcp is not None else None
            replica = Replica()
            guard = replace(listen.guard(names[0] if names else "", history), **journal)
            front = FrontConfig(guard, names[0] if names else None, version("tallow"), conf.threads or physical_cores())
            app = create_front(pool, registry, front, replica, tools)
            try:
                run_uvicorn(app.asgi(), sock, functools.partial(_started, pool, names, replica, sock, listen), replica,
                            listen.drain_timeout, listen.header_timeout)
            finally:
                app.close()
        finally:
            if tools is not None:
                tools.close()
            pool.close()


def _start_recheck(pool, threads: int | None) -> None:
    """Measure the machine again at a quiet moment when its calibration cannot be trusted
    (runtime/calibration/recheck.py), on a thread of its own."""
    import threading

    from tallow.env.machine import probe_options
    from tallow.runtime.calibration import machine
    from tallow.runtime.calibration.recheck import EVERY_S, NICE, QUIET_S, Recheck

    hook = settings.test_recheck()
    if hook == "off":
        return
    opts, path = replace(probe_options(threads), nice=NICE), settings.machine_cache()
    sooner = hook if isinstance(hook, float) else None  # a test's: that quiet, asked every second, any load
    recheck = Recheck(lambda: machine.cached(path, opts), lambda: machine.remeasure(opts),
                      lambda found: machine.keep(path, found), pool.activity,
                      QUIET_S if sooner is None else sooner, load=(lambda: 0.0) if sooner is not None else None)
    threading.Thread(target=recheck.run, args=(pool.closed, _log, EVERY_S if sooner is None else 1.0),
                     name="tallow-recheck", daemon=True).start()


def _started(pool, names: list[str], replica, sock: socket.socket, listen: ListenFlags) -> None:
    """Once the server answers /health and /ready (not ready yet): load the models named, then say so."""
    from tallow.common.net import is_loopback

    _preload(pool, names)
    replica.started()
    bound = sock.getsockname()
    shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
    what = ", ".join(_loaded_line(r) for r in pool.loaded()) or "every stored model, loaded on demand"
    err_console().print(f"serving {what} on http://{shown}:{bound[1]}", soft_wrap=True)
    if listen.open_page:
        from tallow.cli.commands.ui_cmds import open_browser

        open_browser(f"http://{'localhost' if is_loopback(listen.host) else shown}:{bound[1]}/", names[:1])


def _ray_options(on_ray: RayServeFlags, offline: bool, models: list[str], front_only: dict[str, bool]):
    """--ray's settings checked (None without --ray, whose other flags are then refused); the
    flags of the multi-model front have no meaning on Ray Serve and are refused by name."""
    from tallow.cli.ray.connect import checked_options

    opts = checked_options(on_ray.ray, on_ray.ray_replicas, on_ray.ray_cpus_per_replica, on_ray.ray_weights, offline,
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
    from tallow.serve.http.journal import Journal

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

    journal = Journal(base.journal, base.port) if base.journal else None
    pool = Pool(PoolSettings(command=[sys.executable, "-m", "tallow.cli", "runner"], args_for=args_for,
                             socket_dir=Path(private), max_models=max_models, budget=budget, keep_alive=keep,
                             model_arg=runner_model, events=journal.write if journal is not None else None),
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
    up to `drain_s` seconds, then this returns (exit 0); a second SIGTERM, or Ctrl-C, stops at once.
    Without one (a runner), SIGTERM is a graceful shutdown, then this returns."""
    import signal
    import threading

    import uvicorn

    class Server(uvicorn.Server):
        drained = False

        def handle_exit(self, sig, frame) -> None:
            if replica is None and sig == signal.SIGTERM:
                # not handed to uvicorn, which would raise it again once shut down: the default
                # action would end the process before its owner's cleanup (a runner's engine,
                # its thread claim, its usage writer)
                self.drained, self.force_exit, self.should_exit = True, self.should_exit, True
                return
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
