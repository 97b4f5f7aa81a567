"""Continuous batching: many requests decoded together in one llama.cpp context.

One engine thread owns the context. Each step it packs the next token of every decoding
sequence, then prefill chunks of admitted requests up to n_batch tokens, into one
llama_decode; it samples for the rows that asked for logits and hands each request its
events. A finished request frees its slot at once, and the next waiting request takes it
at the following step. Callers talk to the thread only through `submit` (which queues)
and the Handle it returns (which relays events and cancels).

Every slot is a Sequence of the sequence core (runtime/sequence.py) and every request an
OutputStream, as in the engine, so the disk prompt cache, lookup drafts, grammars,
log-probabilities and cancellation work here as they do in `run`.

Deterministic mode makes a request's answer independent of what else is being decoded;
see docs/DESIGN.md (batch invariance) for the three llama.cpp behaviours it works around.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from typing import Any, Callable

from tallow.common.errors import TallowError
from tallow.runtime.adapters import Turns
from tallow.runtime.engine import Engine
from tallow.runtime.errors import BackendError, ContextOverflow
from tallow.runtime.media.prefill import MediaPrefill
from tallow.runtime.scheduling.admission import FairQueue
from tallow.runtime.scheduling.handle import Event, Failure, Handle, QueueFull
from tallow.runtime.scheduling.sched_stats import Stats
from tallow.runtime.scheduling.step_calls import plan_calls
from tallow.runtime.sequence import OutputStream, Sequence, Stops, begin_request, common_prefix, settle_draft
from tallow.runtime.types import FinalEvent, LoadSettings, Request, SchedulerSettings


def load_settings_for(load: LoadSettings, sched: SchedulerSettings) -> LoadSettings:
    """The context a scheduler needs: a sequence per slot, each with a KV stream of its own
    (measured faster than one shared buffer at every N >= 2 here), or one unified buffer;
    deterministic mode adds flash attention (which skips other sequences' cells exactly) and
    plain weight layouts: a repacked matrix multiplies a call's rows four at a time with one
    kernel and the rest with another, so a row's rounding would depend on its place."""
    if sched.parallel < 1:
        raise ValueError("parallel must be at least 1")
    if sched.deterministic:  # and a fixed thread count: nothing about the kernels changes mid-run
        return replace(load, n_seq_max=sched.parallel, kv_unified=False, flash_attn="on", adapt_threads=False,
                       repack=False)
    return replace(load, n_seq_max=sched.parallel, kv_unified=sched.kv_unified)


class _Job:
    def __init__(self, request: Request, model, handle: Handle, limit: int, deadline: float | None) -> None:
        self.request = request
        self.handle = handle
        self.run = OutputStream(request, model)
        self.limit = limit  # KV cells (positions) this request may use
        self.deadline = deadline
        self.sampler: Any = None  # the C sampler chain, made when the job starts
        self.slot: _Slot | None = None
        self.next_token: int | None = None  # sampled, not yet evaluated
        self.drafter: Any = None  # a LookupDrafter or a ModelDrafter, made with the slot (engine.drafter_for)
        self.draft: list[int] = []  # guesses decoded after next_token in this step
        self.stops: Stops | None = None  # where the prefill pauses, to save or checkpoint
        self.leader: _Job | None = None  # the job this one forks from (Scheduler.submit's fork_of)
        self.lora: tuple[float, ...] = ()  # its adapter set (runtime/adapters.py), fixed when it starts

    @property
    def held(self) -> _Slot:
        """The slot of a started job (every job in the active list has one)."""
        assert self.slot is not None
        return self.slot


class _Slot:
    def __init__(self, ctx, seq: int) -> None:
        self.sequence = Sequence(ctx, seq)
        self.job: _Job | None = None
        self.last_used = 0.0

    @property
    def seq(self) -> int:
        return self.sequence.seq

    @property
    def kv(self) -> list[int]:
        """The tokens whose cells this sequence holds, in position order."""
        return self.sequence.kv


class Scheduler:
    def __init__(self, engine: Engine, settings: SchedulerSettings) -> None:
        self.engine = engine
        self.settings = settings
        ctx = engine.ctx
        self.n_ctx = ctx.n_ctx
        self.n_batch = ctx.n_batch
        # A unified KV buffer lets one sequence use all of it; separate streams split it evenly.
        self.unified = settings.kv_unified and not settings.deterministic
        self.capacity = self.n_ctx if self.unified else self.n_ctx // settings.parallel
        self.slots = [_Slot(ctx, i) for i in range(settings.parallel)]
        self._waiting = FairQueue()  # runtime/scheduling/admission.py: tenants (API keys) in turn
        self._active: list[_Job] = []  # admitted, in admission order
        self._cond = threading.Condition()
        self._closing = False
        self.stats = Stats()
        # called on the engine thread with each finished request of a tenant, its final event, and
        # what delivers that event: the meter calls it (from any thread) once the request's books are durable
        self.meter: Callable[[Request, FinalEvent, Callable[[], None]], None] | None = None
        self.journal: Callable[[Request, FinalEvent], None] | None = None  # serve's record of each traced answer
        self.media = MediaPrefill(engine)
        self._turns = Turns()  # which adapter set each step decodes (runtime/adapters.py)
        self._thread = threading.Thread(target=self._loop, name="tallow-engine", daemon=True)
        self._thread.start()

    @classmethod
    def load(cls, paths, load: LoadSettings, settings: SchedulerSettings) -> Scheduler:
        return cls(Engine(paths, load_settings_for(load, settings)), settings)

    # -- the caller's side -------------------------------------------------------------------
    def submit(self, request: Request, on_event: Callable[[Event], None] | None = None,
               fork_of: Handle | None = None) -> Handle:
        """Queue a request. Raises ContextOverflow when it can never fit, QueueFull when too
        many wait. `on_event` is called on the engine thread; without it, read handle.events().
        With `fork_of` (a request of the same prompt submitted just before), it starts from a
        copy of that request's cells once its prompt is evaluated: several answers, one prefill."""
        prompt = request.prompt_tokens
        if not prompt:
            raise ContextOverflow("the prompt is empty")
        if len(prompt) >= self.capacity:
            raise ContextOverflow(
                f"the prompt is {len(prompt)} tokens but a sequence holds {self.capacity} "
                "(one more is needed to answer)", "shorten the prompt, or raise --ctx", len(prompt), self.capacity)
        room = self.capacity - len(prompt)
        wanted = request.max_tokens
        cap = self.settings.max_tokens_cap
        if wanted is None or (cap is not None and wanted > cap):
            wanted = cap if cap is not None else room
        limit = len(prompt) + min(wanted, room)
        deadline = None if self.settings.time_limit_s is None else time.perf_counter() + self.settings.time_limit_s
        if request.draft is None and self.settings.draft is not None:
            request = replace(request, draft=self.settings.draft)
        handle = Handle(on_event)
        job = _Job(request, self.engine.model, handle, limit, deadline)
        job.leader = fork_of.job if fork_of is not None else None
        handle.wake, handle.job = self._wake, job
        with self._cond:
            if self._closing:
                raise QueueFull("the server is shutting down")
            if len(self._waiting) >= self.settings.max_queue:
                self.stats.rejected += 1
                raise QueueFull(f"{len(self._waiting)} requests are already waiting", "try again shortly")
            self._waiting.append(job)
            self._cond.notify()
        return handle

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify()

    @property
    def queue_depth(self) -> int:
        return len(self._waiting)

    @property
    def busy_slots(self) -> int:
        return sum(s.job is not None for s in self.slots)

    @property
    def kv_used(self) -> int:
        return sum(len(s.kv) for s in self.slots)

    def alive(self) -> bool:
        return self._thread.is_alive()  # a health check's question (serve --ray)

    def close(self, keep_engine: bool = False) -> None:
        """Stop the engine thread (requests in flight or waiting fail), then close the engine
        unless its owner closes it (run --n borrows run's)."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join()
        self.media.close()
        if not keep_engine:
            self.engine.close()

    # -- the engine thread ---------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._closing and not self._active and not self._admissible():
                    self._cond.wait(0.25)
                if self._closing:
                    break
                self._admit()
            self._expire()
            if self._active:
                self._step()
        gone = BackendError("the server is shutting down")
        for job in list(self._active) + list(self._waiting):
            self._fail(job, gone)

    def _admissible(self) -> bool:
        return bool(self._waiting) and any(s.job is None for s in self.slots)

    def _admit(self) -> None:
        """Give waiting requests free slots, first come first served (API keys in turn), while
        the KV cache has room for everything they may write (a request that does not fit yet waits)."""
        for job in [j for j in self._waiting if j.handle.cancelled]:
            self._waiting.remove(job)
            job.run.finish = "cancelled"
            self._settle(job, job.run.final())
        while self._waiting:
            job = self._waiting.peek(self.slots)
            free = [s for s in self.slots if s.job is None]
            if job is None or not free or self._prefilling(job.leader):
                return  # a fork waits (briefly) for its leader's prompt, so that it is evaluated once
            prompt = job.request.prompt_tokens
            # The longest cached prefix it can use; else an empty slot rather than one whose
            # conversation would be lost; else the lowest free slot, so that busy sequences stay
            # consecutive (deterministic mode decodes a run of them in one micro-batch).
            slot = max(free, key=lambda s: (s.sequence.usable(prompt), not s.kv, -s.seq)) \
                if not self.engine.adapters.loaded \
                else self.engine.adapters.placement(free, self.slots, job.request.lora, prompt)
            if self.unified and not self._make_room(job, slot, free):
                return
            self._waiting.take(job)
            self._start(job, slot)

    def _prefilling(self, leader: _Job | None) -> bool:
        return leader is not None and leader in self._active and leader.next_token is None \
            and leader.run.t_decode_start is None

    def _fork(self, job: _Job, slot: _Slot) -> None:
        """A fork's slot takes its leader's cells when they hold more of the prompt."""
        lead = job.leader.slot if job.leader is not None else None
        prompt = job.request.prompt_tokens
        if lead is not None and lead is not slot and common_prefix(lead.kv, prompt) > slot.sequence.reusable(prompt):
            slot.sequence.copy_from(lead.sequence)

    def _make_room(self, job: _Job, slot: _Slot, free: list[_Slot]) -> bool:
        """Unified KV: reserve job.limit cells, dropping idle slots' cached prompts (least
        recently used first) if need be."""
        reserved = sum(j.limit for j in self._active)
        idle = sorted((s for s in free if s is not slot and s.kv), key=lambda s: s.last_used)
        held = sum(len(s.kv) for s in idle)
        while reserved + held + job.limit > self.n_ctx and idle:
            victim = idle.pop(0)
            held -= len(victim.kv)
            victim.sequence.clear()
        return reserved + held + job.limit <= self.n_ctx

    def _start(self, job: _Job, slot: _Slot) -> None:
        job.run.timings.queue_ms = (time.perf_counter() - job.run.started) * 1000
        job.slot, slot.job = slot, job
        job.drafter = self.engine.drafter_for(job.run, slot.seq)
        try:
            job.sampler = self.engine.sampler_for(job.request, job.run.forced_token, job.run.kept)
        except TallowError as e:
            slot.job = None
            self._emit(job, Failure(e))
            return
        adapters = self.engine.adapters
        job.lora = adapters.claim(slot.sequence, job.request.lora)  # cells of another set are dropped
        self._fork(job, slot)
        disk = self.engine.disk if adapters.disk_ok(job.lora) else None
        _, job.stops = begin_request(slot.sequence, job.run, disk, job.sampler)
        self._active.append(job)

    def _expire(self) -> None:
        now = time.perf_counter()
        for job in list(self._active):
            if job.handle.cancelled:
                job.run.finish = "cancelled"
                self._finish(job)
            elif job.deadline is not None and now >= job.deadline:
                job.run.finish = "time_limit"
                self._finish(job)

    def media_ready(self, job: _Job, span) -> bool:
        try:
            return self.media.evaluate(job, span)
        except TallowError as e:
            self._fail(job, e)
            return False

    def _step(self) -> None:
        ctx = self.engine.ctx
        self.engine.pace()
        step_began = time.perf_counter()
        lora, group = self._turns.next(self._active)  # llama.cpp's adapters are per context
        self.engine.adapters.apply(lora)
        calls = plan_calls(self, group)
        if not calls and self.media.busy():
            self.media.wait(0.05)  # nothing to step but an encode: wait for it, not spin
        decoded: float | None = None
        for entries, wants in calls:
            began = time.perf_counter()
            try:
                ctx.decode_batch(entries)
            except BackendError as e:
                for job in list(self._active):
                    self._fail(job, e)
                return
            decoded = self._observe(len(entries), wants, began) if len(calls) == 1 else None
            self.stats.steps += 1
            seqs = {e[2] for e in entries}
            self._reached(seqs)
            self._report_progress(seqs)
            for row, job in wants:
                self._sample(job, row)
        if self.engine.drafts is not None and calls:  # the whole step, drafts to sampling
            self.engine.drafts.costs.whole_step(len(calls[0][1]), decoded, (time.perf_counter() - step_began) * 1000)

    def _observe(self, rows: int, wants: list[tuple[int, _Job]], began: float) -> float | None:
        """A call that only decoded (no prompt in it): its cost, for the draft model's rule
        (None: not such a call)."""
        if self.engine.drafts is not None and rows == sum(1 + len(j.draft) for _, j in wants) \
                and all(j.run.t_decode_start is not None for _, j in wants):
            ms = (time.perf_counter() - began) * 1000
            self.engine.drafts.costs.target_step(len(wants), rows, ms)
            return ms
        return None

    def _report_progress(self, seqs: set[int]) -> None:
        """A ProgressEvent to each request that asked, whose prompt the call just evaluated part of."""
        for job in self._active:
            if job.request.progress and job.run.t_last is None and job.held.seq in seqs:
                self._emit(job, job.run.progress(len(job.held.kv)))

    def _reached(self, seqs: set[int]) -> None:
        """Save or checkpoint what the prefill just reached in a call that decoded `seqs` (Stops)."""
        for job in self._active:
            if job.stops is not None and job.held.seq in seqs:
                job.stops.reached()

    def _sample(self, job: _Job, row: int) -> None:
        """Sample the job's next token from `row` (with a draft: check the guesses decoded in
        rows after it, as the engine does) and take what the model chose."""
        run, seq, ctx = job.run, job.held.sequence, self.engine.ctx
        if run.t_decode_start is None:
            run.decoding()
        sample = job.sampler.sample
        if job.draft:
            draft, job.draft = job.draft, []
            assert job.drafter is not None  # a draft comes from the job's drafter
            accepted, after = settle_draft(seq, run, job.drafter, draft, lambda i: sample(ctx, row + i))
            sampled = [(row + i, t) for i, t in enumerate(accepted)] + [(row + len(accepted), after)]
        else:
            sampled, accepted = [(row, sample(ctx, row))], []
        first, gaps = run.t_last is None, len(run.timings.itl_ms)
        events, ended = run.take_all(ctx, sampled, len(accepted))
        if first and run.t_last is not None:
            self.stats.ttft.observe(run.timings.ttft_ms / 1000)
        for gap in run.timings.itl_ms[gaps:]:
            self.stats.itl.observe(gap / 1000)
        for event in events:
            self._emit(job, event)
        if ended is not None:  # like plain decoding, the last token taken stays out of the cache
            seq.keep(len(seq.kv) - (len(sampled) - ended))
            self._finish(job)
        elif len(seq.kv) >= job.limit:
            run.finish = "length"
            self._finish(job)
        else:
            job.next_token = sampled[-1][1]
            if job.drafter is not None:
                job.drafter.extend(t for _, t in sampled)

    def _finish(self, job: _Job) -> None:
        final = job.run.final()
        self.stats.count(final)
        disk, slot = self.engine.disk, job.slot
        if disk is not None and slot is not None and disk.prefixes(job.request) and self.engine.adapters.disk_ok(job.lora):
            self._settle(job, final)  # the answer first: saving its prompt never delays it
            disk.save(slot.sequence, job.request)
            self._release(job)
        else:
            self._release(job)
            self._settle(job, final)

    def _settle(self, job: _Job, final: FinalEvent) -> None:
        """A request's books, then its final event. A metered request's event waits (off this
        thread) for its usage row to be durable, so that a process killed in between loses the
        answer with its row, never one without the other; the journal's record follows the row."""
        def deliver() -> None:
            if self.journal is not None and job.request.trace is not None:
                self.journal(job.request, final)  # one short line appended to a file
            self._emit(job, final)
        if self.meter is not None and job.request.tenant is not None:
            self.meter(job.request, final, deliver)  # serve's metering queues the row: the engine never waits
        else:
            deliver()

    def _fail(self, job: _Job, error: TallowError) -> None:
        if job.slot is not None:
            job.slot.sequence.clear()
        self._release(job)
        self._emit(job, Failure(error))

    def _release(self, job: _Job) -> None:
        self.media.forget(job)
        if job in self._active:
            self._active.remove(job)
        if job.sampler is not None:
            job.sampler.close()
            job.sampler = None
        slot = job.slot
        if slot is not None:
            slot.job = None
            slot.last_used = time.perf_counter()
            # The prompt stays cached for a follow-up; generated tokens stay too (a chat's
            # next turn starts with them). Cells past the limit were never written.
        job.slot = None

    def _emit(self, job: _Job, event: Event) -> None:
        try:
            job.handle.deliver(event)
        except Exception:  # a consumer that went away must not stop the engine
            job.handle.cancelled = True
