"""`tallow batch --ray ADDRESS`: the batch's requests answered by a pool of Ray actors, each
one tallow engine, the output written here (jobs/ray_pool.py, docs/DESIGN.md "Batch files
on Ray")."""

from __future__ import annotations

from pathlib import Path

from tallow.cli.ray.connect import SHIP_MAX, RayOptions, actor_count, connect, import_ray, node_load


def run_on_ray(opts: RayOptions, local, load, sched, limits, forced_format, fleet_settings, input: Path, out,
               previous, total: int, progress):
    """Answer the batch on the cluster; (the fleet's stats, the pool's stats)."""
    from tallow.runtime.opening import prepared

    ray = import_ray(opts.address)
    load = node_load(prepared(local, load), opts.cpus_per_actor)
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
    from tallow.jobs.records import read_lines
    from tallow.runtime.node_weights import load_files, plan

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
