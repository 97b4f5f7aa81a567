"""`tallow batch --ray`: the batch's members are Ray actors, each one tallow engine
(jobs/ray_actor.py), driven by the fleet's loop (jobs/fleet.py) from the driver, which is
the output file's only writer: the same records, resume, retries and prefix affinity as a
batch over servers (docs/DESIGN.md, "Batch files on Ray").

An actor that dies (its process killed, its node gone) fails the calls it had; each is
retried on another member, and the actor is replaced by a new one, which takes requests
once it has loaded (on a node with room: until then it waits, and the others carry on)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError

from tallow.client.endpoint import RemoteError
from tallow.common.errors import TallowError
from tallow.jobs.fleet import Answered, Job
from tallow.jobs.ray_actor import ActorSpec, BatchActor
from tallow.runtime.node_weights import may_ship, shipped


@dataclass
class PoolSettings:
    actors: int
    cpus_per_actor: int
    concurrency: int  # calls in flight per actor (its slots)
    weights: str = "auto"  # --ray-weights
    ship_max: int = 1 << 30  # with "auto": the largest file shipped to a node that lacks it


@dataclass
class PoolStats:
    replaced: int = 0  # actors that died and were started again
    causes: list[str] = field(default_factory=list)  # why each died
    nodes: dict[str, int] = field(default_factory=dict)  # node address -> actors that loaded there
    weights: dict[str, str] = field(default_factory=dict)  # file -> "path" / "shipped" (the last actor's)


class RayPool:
    """The actors of one batch run, started at once, killed when it ends."""

    def __init__(self, spec: ActorSpec, settings: PoolSettings) -> None:
        self.spec, self.settings, self.stats = spec, settings, PoolStats()
        self.lock = threading.Lock()
        # max_restarts=0: a dead actor is replaced here, where its calls are known, not by Ray
        self.actor_class = ray.remote(BatchActor).options(num_cpus=settings.cpus_per_actor, max_restarts=0,
                                                         max_concurrency=settings.concurrency + 2,
                                                         scheduling_strategy="SPREAD")
        self.targets = [RayTarget(self, i) for i in range(settings.actors)]

    def spawn(self):
        return self.actor_class.remote(self.spec)

    def ship(self, path: str) -> bool:
        """Ship a file a node lacked, once, for the actors started from now on; False when it
        may not be (too large, or not in auto mode)."""
        with self.lock:
            w = self.spec.weights[path]
            if w.blob is not None:
                return True
            if not may_ship(w, self.settings.weights, self.settings.ship_max):
                return False
            self.spec = replace(self.spec, weights={**self.spec.weights, path: shipped(w, ray.put)})
            return True

    def close(self) -> None:
        for t in self.targets:
            t.kill()


class RayTarget:
    """One actor as a fleet member's target (jobs/fleet.Target)."""

    def __init__(self, pool: RayPool, index: int) -> None:
        self.pool, self.index = pool, index
        self.lock = threading.Lock()
        self.name = f"actor {index}"
        self.start()

    def start(self) -> None:
        self.actor = self.pool.spawn()
        self.ready_ref = self.actor.ready.remote()
        self.loaded = False

    def kill(self) -> None:
        try:
            ray.kill(self.actor, no_restart=True)
        except Exception:  # noqa: BLE001 - gone already
            pass

    def replace(self, dead, cause: str | None = None) -> None:
        """A new actor in the place of `dead` (once, however many calls saw it die); `cause`:
        why it died (None: it was stopped on purpose)."""
        with self.lock:
            if self.actor is not dead:
                return
            self.kill()
            if cause is not None:
                self.pool.stats.replaced += 1
                self.pool.stats.causes.append(cause)
            self.start()

    def ready(self) -> bool:
        """Loaded and taking calls. An actor that could not load its engine stops the run: the
        next would fail the same way."""
        if self.loaded:
            return True
        actor, ref = self.actor, self.ready_ref
        done, _ = ray.wait([ref], timeout=0)
        if not done:
            return False
        try:
            info = ray.get(ref)
        except RayActorError as exc:  # died while loading: its node went away
            self.replace(actor, cause=type(exc).__name__)
            return False
        if info["missing"] and self.pool.ship(info["missing"]):  # started again, with the file shipped
            self.replace(actor)
            return False
        if info["error"]:
            raise TallowError(f"the actor on node {info['node']} could not start: {info['error']}")
        self.name = f"actor {self.index} on {info['node']}"
        stats = self.pool.stats
        stats.nodes[info["node"]] = stats.nodes.get(info["node"], 0) + 1
        stats.weights.update(info["weights"])
        self.loaded = True
        return True

    def answer(self, job: Job, timeout: float) -> Answered:
        actor = self.actor
        ref = actor.answer.remote(job.body)
        try:
            out: dict[str, Any] = ray.get(ref, timeout=timeout)
        except RayActorError as exc:
            self.replace(actor, cause=type(exc).__name__)
            raise RemoteError(f"{self.name} died: {type(exc).__name__}", retryable=True) from None
        except GetTimeoutError:
            ray.cancel(ref)
            raise RemoteError(f"{self.name} gave no answer in {timeout:.0f} s", retryable=True) from None
        if "error" in out:
            raise RemoteError(out["error"])
        record = out["record"]
        usage = record.get("usage", {})
        return Answered(record, usage.get("completion_tokens", 0), usage.get("prompt_tokens"),
                        usage.get("cached_tokens"))
