"""`tallow batch --ray ADDRESS`: the batch's requests answered by a pool of Ray actors, each
one tallow engine, the output written here (jobs/ray_pool.py, docs/DESIGN.md "Batch files
on Ray")."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import urlsplit

from tallow.common.errors import TallowError
from tallow.common.net import is_loopback

SHIP_MAX = 1 << 30  # --ray-weights auto ships files up to 1 GiB through Ray's object store
EXTRA = 'pip install "tallow[ray]"'


@dataclass(frozen=True)
class RayOptions:
    address: str  # local | auto | ray://host:port | host:port
    actors: int  # 0: as many as the cluster's CPUs hold
    cpus_per_actor: int
    weights: str  # auto | path | ship


def import_ray(address: str = "auto"):
    """Ray, or the one-line refusal naming the extra."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # Ray reports usage over the network unless told not to
    if address == "local" or _loopback(address):
        # Ray turns a loopback address into this machine's outward one (and connects there)
        # unless told the cluster is this machine alone; read when Ray is imported
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    try:
        import ray
    except ImportError:
        raise TallowError(f"--ray needs Ray, an optional extra: {EXTRA}") from None
    return ray


def check_address(address: str, offline: bool) -> None:
    """`local` starts a cluster on 127.0.0.1 for the job; offline, any other must be loopback."""
    if address == "local" or not offline:
        return
    if not _loopback(address):
        raise TallowError(f"offline: refusing the Ray cluster {address!r}, which is not named as this machine",
                          "give --ray local, or the head's loopback address (127.0.0.1:6379), or drop --offline")


def _loopback(address: str) -> bool:
    host = urlsplit(address if "://" in address else f"ray://{address}").hostname
    return address != "auto" and host is not None and is_loopback(host)


def connect(ray, address: str) -> None:
    if address == "local":  # a cluster of this machine for the job, on loopback only
        ray.init(_node_ip_address="127.0.0.1", include_dashboard=False, logging_level="ERROR",
                 log_to_driver=False, namespace="tallow")
    else:
        ray.init(address=address, logging_level="ERROR", log_to_driver=False, namespace="tallow")


def actor_count(ray, opts: RayOptions) -> int:
    if opts.actors:
        return opts.actors
    return max(1, int(ray.cluster_resources().get("CPU", 1)) // opts.cpus_per_actor)


def run_on_ray(opts: RayOptions, local, load, sched, limits, forced_format, fleet_settings, input: Path, out,
               previous, total: int, progress):
    """Answer the batch on the cluster; (the fleet's stats, the pool's stats)."""
    from tallow.cli.models import with_own_settings, with_projector

    ray = import_ray(opts.address)
    load = with_own_settings(with_projector(local, load, "if-stored"), local)
    # The actors' engines: the driver's machine profile and thread registry describe this
    # machine, not the nodes; each engine uses exactly the CPUs Ray gave its actor.
    load = replace(load, n_threads=opts.cpus_per_actor, machine=None, registry=None, adapt_threads=False,
                   related_pids=())
    connect(ray, opts.address)
    try:
        return _run(ray, opts, local, load, sched, limits, forced_format, fleet_settings, input, out, previous,
                    total, progress)
    finally:
        ray.shutdown()


def _run(ray, opts, local, load, sched, limits, forced_format, fleet_settings, input, out, previous, total,
         progress):
    from tallow.jobs.fleet import Fleet, FleetStats
    from tallow.jobs.ray_actor import ActorSpec
    from tallow.jobs.ray_pool import PoolSettings, RayPool
    from tallow.jobs.ray_weights import load_files, plan
    from tallow.jobs.records import read_lines

    weights = plan(load_files(load, local.paths), opts.weights, ray.put)
    spec = ActorSpec(tuple(str(p) for p in local.paths), weights, load, sched, limits, forced_format)
    pool = RayPool(spec, PoolSettings(actor_count(ray, opts), opts.cpus_per_actor, sched.parallel, opts.weights,
                                      SHIP_MAX))
    try:
        fleet = Fleet(pool.targets, fleet_settings, local.name)
        stats = FleetStats(total=total, holders="actors")
        with progress(total) as show:
            fleet.run(read_lines(input), out, previous, stats, show)
        return stats, pool.stats
    finally:
        pool.close()
