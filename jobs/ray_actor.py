"""The Ray actor of `tallow batch --ray`: one tallow engine on a worker, answering whole
requests as a local batch answers its lines (jobs/batch.py), one thread per call.

Ray imports this module on every worker by name; it imports Ray only inside the methods
that run there, so the driver's side stays importable without it."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from tallow.common.errors import TallowError
from tallow.jobs.batch import answer_body
from tallow.runtime.node_weights import Missing, WeightFile, load_on_node, node_name
from tallow.runtime.types import LoadSettings, SchedulerSettings
from tallow.wire.request import Limits


@dataclass(frozen=True)
class ActorSpec:
    model_paths: tuple[str, ...]  # the driver's paths of the model's shards (keys of `weights`)
    weights: dict[str, WeightFile]
    load: LoadSettings  # with the driver's paths; threads fixed to the actor's CPUs
    sched: SchedulerSettings
    limits: Limits  # less what the engine knows (vocabulary, tool format, adapters)
    forced_format: str | None = None  # --tool-format
    timeout_s: float = 600.0  # one request


class BatchActor:
    """Built on its worker: finds the weights there and loads the engine. A failure to do so
    is kept and reported by ready(), so the driver can tell a bad setup (every actor would
    fail the same way: the run stops) from a node that died (the actor is replaced)."""

    def __init__(self, spec: ActorSpec) -> None:
        import ray

        self.spec, self.sched, self.error, self.missing = spec, None, None, None
        self.node = node_name(ray)
        self.sources: dict[str, str] = {}
        try:
            self.sched = self._load(spec, ray.get)
        except TallowError as exc:
            self.missing = exc.path if isinstance(exc, Missing) else None
            self.error = exc.message + (f" ({exc.hint})" if exc.hint else "")

    def _load(self, spec: ActorSpec, fetch):
        sched, self.sources = load_on_node(spec.model_paths, spec.weights, spec.load, spec.sched, self.node, fetch)
        engine = sched.engine
        self.limits = replace(spec.limits, n_vocab=engine.model.n_vocab, n_adapters=len(engine.adapters.specs),
                              tool_format=spec.forced_format or engine.tool_format())
        return sched

    def ready(self) -> dict[str, Any]:
        """Where this actor runs, and how it got its weights; or the error that stopped it
        (and the file this node lacked, when that was it)."""
        return {"node": self.node, "error": self.error, "missing": self.missing, "weights": self.sources}

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        """{"record": the line's record less its id} or {"error": why the line failed}."""
        if self.sched is None:
            return {"error": self.error or "the engine is not loaded"}
        try:
            return {"record": answer_body(self.sched, body, self.limits, self.spec.timeout_s)}
        except TallowError as exc:
            return {"error": exc.message}
