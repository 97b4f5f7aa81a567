"""`tallow serve MODEL --ray ADDRESS`: the model as a Ray Serve application on a cluster
(serve/ray/deployment.py, docs/DESIGN.md "Serving on Ray"): replicas of the runner's app,
an ingress that routes by prefix, Ray Serve's proxy on --host and --port. This command
deploys it, waits, and on SIGTERM or Ctrl-C deletes it (Ray Serve drains the replicas)."""

from __future__ import annotations

import signal
import threading
from dataclasses import dataclass, replace
from typing import Any, cast

from tallow.cli.ray.connect import SHIP_MAX, RayOptions, actor_count, connect, import_ray, node_load
from tallow.cli.render import err_console
from tallow.common.errors import TallowError

AFFINITY_CHARS = 512  # as tallow batch's --affinity-chars default


@dataclass(frozen=True)
class Front:
    """What the HTTP side takes from serve's options."""

    host: str
    port: int
    api_key: str | None
    cors: tuple[str, ...]
    drain_timeout: float


def serve_on_ray(opts: RayOptions, model: str, base, front: Front, offline: bool) -> None:
    from tallow.cli import presets
    from tallow.cli.models import find_model
    from tallow.cli.served import fingerprint, runner_load
    from tallow.runtime.opening import prepared

    ray = import_ray(opts.address)
    local = find_model(model, offline)
    conf = presets.for_runner(base, local.preset)
    load = node_load(prepared(local, runner_load(conf)),
                     opts.cpus_per_actor)
    server = replace(conf.server(local.name, fingerprint(local.sha256, conf.deterministic)), host=front.host,
                     api_key=front.api_key, cors=front.cors, history=":memory:")
    connect(ray, opts.address)
    try:
        _deploy_and_wait(ray, opts, local, load, conf, server, front)
    finally:
        ray.shutdown()


def _weights(ray, opts: RayOptions, files):
    """The files' plan: with auto, those up to 1 GiB are also shipped (a replica that lacks
    one cannot ask for it while Ray Serve keeps restarting it), and a node that has the file
    at the driver's path still uses that."""
    from tallow.runtime.node_weights import may_ship, plan, shipped

    weights = plan(files, "path" if opts.weights == "auto" else opts.weights, ray.put)
    return {k: shipped(w, ray.put, by_path=True) if may_ship(w, opts.weights, SHIP_MAX) else w
            for k, w in weights.items()}


def _deploy_and_wait(ray, opts: RayOptions, local, load, conf, server, front: Front) -> None:
    import logging

    from ray import serve
    from ray.serve.config import HTTPOptions, RequestRouterConfig

    logging.getLogger("ray.serve").setLevel(logging.WARNING)  # its progress lines; this command says what matters

    from tallow.runtime.node_weights import load_files
    from tallow.serve.ray.deployment import AffinityRouter, Ingress, ModelReplica, ReplicaSpec

    replicas = actor_count(ray, opts)
    spec = ReplicaSpec(tuple(str(p) for p in local.paths), _weights(ray, opts, load_files(load, local.paths)), load,
                       conf.scheduler(), server)
    deployment: Any = serve.deployment  # (typed as a decorator only)
    model = deployment(ModelReplica).options(
        name="model", num_replicas=replicas, ray_actor_options={"num_cpus": opts.cpus_per_actor},
        max_ongoing_requests=conf.parallel + conf.max_queue, health_check_period_s=10,
        graceful_shutdown_timeout_s=front.drain_timeout, graceful_shutdown_wait_loop_s=0.5,
        request_router_config=RequestRouterConfig(request_router_class=cast(Any, AffinityRouter)))
    ingress = deployment(Ingress).options(name="ingress", num_replicas=1, ray_actor_options={"num_cpus": 0},
                                                max_ongoing_requests=4096,
                                                graceful_shutdown_timeout_s=front.drain_timeout + 5)
    name = "tallow-" + "".join(ch if ch.isalnum() else "-" for ch in local.name)
    serve.start(http_options=HTTPOptions(host=front.host, port=front.port))
    stop, got = threading.Event(), []

    def on_signal(sig, _frame) -> None:
        if stop.is_set():  # a second one: stop at once, as tallow serve does
            raise KeyboardInterrupt
        got.append(sig)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    try:
        serve.run(ingress.bind(model.bind(spec), AFFINITY_CHARS), name=name, route_prefix="/")
    except Exception as exc:  # noqa: BLE001 - Ray's own failure to deploy: said in one line
        raise TallowError(f"Ray Serve could not deploy {local.name}: {str(exc).splitlines()[0]}") from None
    err_console().print(f"serving {local.name} on http://{front.host}:{front.port} (Ray Serve application {name}: "
                        f"{replicas} replica{'s' if replicas != 1 else ''} of {opts.cpus_per_actor} CPU)",
                        soft_wrap=True, markup=False)
    try:
        stop.wait()
    finally:
        err_console().print("draining: the requests in flight finish, then the application is deleted",
                            markup=False)
        serve.delete(name)
    if got == [signal.SIGINT]:  # Ctrl-C: drained, and still an interrupted command (exit 130)
        raise KeyboardInterrupt
