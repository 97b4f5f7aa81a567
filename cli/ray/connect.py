"""Reaching a Ray cluster for `batch --ray` and `serve --ray`: the extra, the address (and
offline mode), the connection, and what an engine on a node is given."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from urllib.parse import urlsplit

import typer

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


def node_load(load, cpus: int):
    """The load of an engine on a node: the driver's machine profile and thread registry
    describe the driver's machine, not the node's, and the engine uses exactly the CPUs
    Ray reserved for it."""
    return replace(load, n_threads=cpus, machine=None, registry=None, adapt_threads=False, related_pids=())


def checked_options(address: str | None, count: int, cpus: int, weights: str, offline: bool,
                    flags: tuple[str, str], what: str) -> RayOptions | None:
    """--ray and its flags (`flags`: the count's and the CPUs' names) checked, and Ray
    imported; None without --ray, whose other flags are then refused, naming `what` they set."""
    from tallow.runtime.node_weights import WEIGHT_MODES

    if address is None:
        for flag, used in ((flags[0], count != 0), (flags[1], cpus != 1), ("--ray-weights", weights != "auto")):
            if used:
                raise typer.BadParameter(f"this sets the {what} on a Ray cluster: give --ray", param_hint=flag)
        return None
    if weights not in WEIGHT_MODES:
        raise typer.BadParameter(f"use one of {', '.join(WEIGHT_MODES)}", param_hint="--ray-weights")
    check_address(address, offline)
    import_ray(address)
    return RayOptions(address, count, cpus, weights)
