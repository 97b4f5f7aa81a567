"""An engine's LoRA adapters: loaded with the model, by id in load order, each with a default
scale (the load's, changed by POST /lora-adapters), and a request's own scales in their
place when it names some (llama-server's `lora` field: an adapter it does not name is off).

llama.cpp applies adapters to a whole context, not to a sequence. So a set of scales is a
request's *adapter set*: the scheduler decodes one set per llama_decode call (grouping the
requests that share one), and a sequence's cached KV is only reused by a request of the
same set (`claim`). The disk prompt cache is keyed by the load's scales, so only requests
with those use it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tallow.common.files import sha256_file
from tallow.models.adapter import check_adapters
from tallow.runtime.types import LoraSpec

Scales = tuple[float, ...]


class Adapters:
    def __init__(self, model, ctx, specs: tuple[LoraSpec, ...], model_paths: list[Path]) -> None:
        self.ctx, self.specs = ctx, specs
        self.loaded: list = []
        self.facts: list = []
        if specs:
            from tallow.runtime.backend.lora import Adapter

            self.facts = check_adapters([s.path for s in specs], model_paths)
            self.loaded = [Adapter(model, s.path) for s in specs]
        self.initial: Scales = tuple(s.scale for s in specs)
        self.defaults: Scales = self.initial
        self._applied: Scales = tuple(0.0 for _ in specs)  # what the context has now: none
        self._made_with: dict[int, Scales] = {}  # a sequence (by id) -> the set its KV was made with

    def scales(self, lora: Scales | None) -> Scales:
        """A request's adapter set: its own scales, or the defaults."""
        return self.defaults if lora is None else lora

    def claim(self, sequence, lora: Scales | None) -> Scales:
        """The set a request runs with, on `sequence`: the sequence's cached cells are dropped
        when they were computed with another set (their keys and values would be wrong)."""
        key = self.scales(lora)
        if self.loaded and self._made_with.get(id(sequence), key) != key:
            sequence.clear()
        self._made_with[id(sequence)] = key
        return key

    def apply(self, key: Scales | None) -> None:
        """Put this set on the context before a decode of its requests."""
        if key is not None and key != self._applied and self.loaded:
            from tallow.runtime.backend.lora import apply

            apply(self.ctx, [(a, s) for a, s in zip(self.loaded, key) if s != 0.0])
            self._applied = key

    def placement(self, free: list, slots: list, lora: Scales | None, prompt: list[int]):
        """The free slot for a request of this set (the scheduler's, each with .seq, .job,
        .sequence and .kv): its cached prefix first, when that was made with this set; then a
        slot next to the set's running requests, or as far as can be from other sets'. With
        a KV stream per sequence llama.cpp splits a batch into runs of consecutive sequence
        ids, so a set's requests side by side decode in one micro-batch, not one each."""
        from tallow.runtime.sequence import common_prefix

        key = self.scales(lora)
        set_of = {s.seq: s.job.lora for s in slots if s.job is not None}
        others = [seq for seq, k in set_of.items() if k != key]

        def score(s):
            reusable = common_prefix(s.kv, prompt) if self._made_with.get(id(s.sequence), key) == key else 0
            beside = sum(set_of.get(s.seq + d) == key for d in (-1, 1))
            distance = min((abs(s.seq - o) for o in others), default=len(slots))
            return reusable, beside, distance, -s.seq

        return max(free, key=score)

    def disk_ok(self, key: Scales) -> bool:
        """Whether a request of this set may use the disk prompt cache (keyed by the load's)."""
        return key == self.initial

    def identity(self) -> list[Any]:
        """The adapters and scales the disk prompt cache's key holds."""
        return [[sha256_file(s.path), s.scale] for s in self.specs]

    def describe(self) -> list[dict[str, Any]]:
        """GET /lora-adapters: each adapter with its id and default scale."""
        return [{"id": i, "path": str(s.path), "scale": self.defaults[i], "task_name": f.task_name,
                 "prompt_prefix": f.prompt_prefix} for i, (s, f) in enumerate(zip(self.specs, self.facts))]


class Turns:
    """Which adapter set the scheduler decodes this step. With one set, every job, every step.
    With several, the sets take turns of up to STEPS steps each, in the order their oldest
    jobs came: llama.cpp rebuilds its graph when the adapters change (measured: a switch
    costs about 40% of a decode step of the default model), so a turn spreads that cost,
    and no set waits more than STEPS steps per other set."""

    STEPS = 8

    def __init__(self) -> None:
        self.key: Scales | None = None  # the set decoded last step
        self.steps = 0  # steps of it in a row

    def next(self, jobs: list) -> tuple[Scales | None, list]:
        keys = list(dict.fromkeys(j.lora for j in jobs))
        if len(keys) <= 1:
            self.key = keys[0] if keys else self.key
            return self.key, jobs
        if self.key in keys and self.steps < self.STEPS:
            self.steps += 1
        else:
            self.key = keys[(keys.index(self.key) + 1) % len(keys)] if self.key in keys else keys[0]
            self.steps = 1
        return self.key, [j for j in jobs if j.lora == self.key]
