"""tallow batch --ray against a local tallow batch on this machine, and what Ray adds to
each request.

    python tests/benchmarks/ray_batch.py [--model PATH] [--requests 64] [--tokens 32] [--rounds 5]

A Ray cluster of this machine (tests/helpers/ray_cluster.py: a head without CPUs and two
worker nodes of one CPU each, on 127.0.0.1) is started once. Then, in paired, alternating
rounds (tests/benchmarks/paired.py), the same file of --requests requests (--tokens new
tokens each, end of generation banned, temperature 0):
  local  tallow batch, one engine of 2 threads, --parallel 8
  ray    tallow batch --ray ADDRESS, 2 actors of 1 CPU (1 thread) each, --parallel 4 each
Each run's output tok/s is its own report (from its first request to its last answer:
loading the engines is excluded on both sides). Target: ray >= 0.9x local; exits 1 when
missed, 3 when the machine was too noisy to say.

Then the per-request cost of Ray itself: one actor and one in-process engine of the same
settings (1 thread), 20 one-token requests each, sent one at a time; the difference of the
median latencies is what a request pays for going through Ray (the call, pickling, the
object store). From the measured per-actor rate, the script states what a second machine
of this kind would add, on paper: scaling needs more machines than CI has.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from helpers.ray_cluster import LoopbackCluster  # noqa: E402 - sets Ray's environment before Ray loads

from benchmarks.fleet import batch, write_batch  # noqa: E402
from benchmarks.overhead import default_model  # noqa: E402
from benchmarks.paired import Comparison, compare, exit_code  # noqa: E402

TARGET = 0.9
PROBES = 20


def call_latencies(model: Path, address: str) -> tuple[list[float], list[float]]:
    """(in-process, through one Ray actor) latencies of one-token requests, one at a time."""
    import ray

    from tallow.jobs.batch import answer_body
    from tallow.jobs.fleet import Job
    from tallow.jobs.ray_actor import ActorSpec
    from tallow.jobs.ray_pool import PoolSettings, RayPool
    from tallow.runtime.node_weights import plan
    from tallow.runtime.scheduling.scheduler import Scheduler
    from tallow.runtime.types import LoadSettings, SchedulerSettings
    from tallow.wire.request import Limits

    load = LoadSettings(n_ctx=4096, n_threads=1, adapt_threads=False)
    sched_settings = SchedulerSettings(parallel=4, max_queue=16, max_tokens_cap=64)
    body = {"messages": [{"role": "user", "content": "Say one word."}], "max_tokens": 1, "temperature": 0}
    local = Scheduler.load([model], load, sched_settings)
    limits = Limits(max_tokens=64, model=model.name, n_vocab=local.engine.model.n_vocab)
    inproc = []
    try:
        for _ in range(PROBES):
            t = time.perf_counter()
            answer_body(local, body, limits, 60)
            inproc.append(time.perf_counter() - t)
    finally:
        local.close()
    ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    pool = RayPool(ActorSpec((str(model),), plan([model], "path", ray.put), load, sched_settings,
                             Limits(max_tokens=64, model=model.name)), PoolSettings(1, 1, 4))
    try:
        target = pool.targets[0]
        while not target.ready():
            time.sleep(0.05)
        through = []
        for i in range(PROBES):
            t = time.perf_counter()
            target.answer(Job(i, i, "/chat/completions", body, None), 60)
            through.append(time.perf_counter() - t)
    finally:
        pool.close()
        ray.shutdown()
    return inproc, through


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    model = a.model or default_model()
    env = {**os.environ, "TALLOW_NO_LOG": "1"}
    cluster = LoopbackCluster(workers=2)
    try:
        with tempfile.TemporaryDirectory(prefix="tallow-ray-") as tmp:
            inp, out = Path(tmp) / "in.jsonl", Path(tmp) / "out.jsonl"
            write_batch(inp, a.requests, a.tokens)
            common = [str(inp), "-m", str(model), "--ctx", "8192", "--offline"]
            local_args = [*common, "--threads", "2", "--parallel", "8"]
            ray_args = [*common, "--parallel", "4", "--ray", cluster.address, "--ray-actors", "2"]
            print(f"{a.requests} requests of {a.tokens} tokens; model {model.name}; "
                  f"cluster {cluster.address} (2 workers x 1 CPU)")
            print("subject batch --ray, reference the local batch")
            verdict = compare(Comparison("--ray / local", lambda arm: batch(ray_args if arm == "subject" else local_args,
                                                                            env, out),
                                         TARGET, False, a.rounds, unit=" tok/s"))
        inproc, through = call_latencies(model, cluster.address)
    finally:
        cluster.shutdown()
    cost = (statistics.median(through) - statistics.median(inproc)) * 1000
    print(f"per request: {statistics.median(inproc) * 1000:.1f} ms in-process, {statistics.median(through) * 1000:.1f} ms "
          f"through a Ray actor -> Ray adds {cost:.1f} ms")
    per_actor = statistics.median(verdict.figures["subject"]) / 2
    print(f"on paper: each 1-CPU actor gave {per_actor:.1f} tok/s here; a second machine like this one adds 2 "
          f"more actors, about {2 * per_actor:.0f} tok/s, less {cost:.1f} ms per request of {a.tokens} tokens "
          f"({cost / 1000 * per_actor / a.tokens:.1%} of an actor's time at this rate)")
    return exit_code([verdict])


if __name__ == "__main__":
    raise SystemExit(main())
