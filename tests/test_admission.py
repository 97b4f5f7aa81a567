"""Fair admission between tenants (API keys), and the scheduler's meter: every
request of a tenant metered, its answer ended only once its row is written."""

from __future__ import annotations

import sqlite3
import threading
import time
from dataclasses import dataclass, replace

import pytest

from tallow.runtime.scheduling.admission import FairQueue
from tallow.runtime.scheduling.scheduler import Scheduler
from tallow.runtime.types import FinalEvent, LoadSettings, Request, Sampling, SchedulerSettings, TokenEvent
from tallow.serve.http.usage import Row, UsageWriter


@dataclass
class Job:
    label: str
    request: Request


def test_tenants_take_turns_and_each_keeps_its_order():
    q = FairQueue()
    for label in ["A1", "A2", "A3", "B1", "A4", "C1", "C2", "A5"]:
        q.append(Job(label, Request([1], tenant=label[0])))
    order = []
    while q:
        job = q.peek()
        q.take(job)
        order.append(job.label)
    assert order == ["A1", "B1", "C1", "A2", "C2", "A3", "A4", "A5"]


def test_without_tenants_it_is_first_come_first_served():
    q = FairQueue()
    for i in range(5):
        q.append(Job(str(i), Request([1])))
    order = []
    while q:
        q.take(job := q.peek())
        order.append(job.label)
    assert order == ["0", "1", "2", "3", "4"]


@pytest.fixture(scope="module")
def one_slot(synth_model):
    s = Scheduler.load([synth_model], LoadSettings(n_ctx=4096, n_threads=2), SchedulerSettings(parallel=1))
    yield s
    s.close()


def first_tokens(sched, tenants: list[str | None]) -> list[int]:
    """Submit one request per tenant (the first one long, holding the one slot while the
    others queue); the order in which the requests' first tokens came."""
    order: list[int] = []
    prompt = sched.engine.prompt_for([{"role": "user", "content": "hello"}])
    base = Request(prompt, 8, sampling=Sampling(temperature=0), ignore_eos=True)
    for i, tenant in enumerate(tenants):
        seen = []

        def on_event(ev, i=i, seen=seen):
            if isinstance(ev, TokenEvent) and not seen:
                seen.append(True)
                order.append(i)
        sched.submit(replace(base, tenant=tenant, max_tokens=1000 if i == 0 else 8), on_event)
    for _ in range(1200):  # bounded: the engine thread answers them all within seconds
        if len(order) == len(tenants):
            break
        time.sleep(0.05)
    return order


def test_one_keys_flood_does_not_starve_another_key(one_slot):
    # key a holds the slot and queues five more; key b's one request is next when the slot frees
    assert first_tokens(one_slot, ["a", "a", "a", "a", "a", "a", "b"]) == [0, 6, 1, 2, 3, 4, 5]
    # with no keys, the same requests are served in arrival order
    assert first_tokens(one_slot, [None] * 7) == [0, 1, 2, 3, 4, 5, 6]


def test_the_meter_sees_every_finished_request_of_a_tenant(one_slot):
    seen: list[tuple[str | None, FinalEvent]] = []
    def meter(req, final, then):
        seen.append((req.tenant, final))
        then()
    one_slot.meter = meter
    try:
        prompt = one_slot.engine.prompt_for([{"role": "user", "content": "hi"}])
        long = one_slot.submit(Request(prompt, 300, sampling=Sampling(temperature=0), ignore_eos=True, tenant="k"))
        waiting = one_slot.submit(Request(prompt, 5, tenant="k"))
        waiting.cancel()  # cancelled before it had a slot: metered with what it used (nothing)
        untenanted = one_slot.submit(Request(prompt, 3))
        finals = [next(ev for ev in h.events() if isinstance(ev, FinalEvent)) for h in (long, waiting, untenanted)]
    finally:
        one_slot.meter = None
    assert [t for t, _ in seen] == ["k", "k"]  # a request with no tenant is not metered
    by_reason = {f.finish_reason: f for _, f in seen}
    assert set(by_reason) == {"length", "cancelled"} and by_reason["length"].usage.completion_tokens == 300
    assert by_reason["cancelled"].usage.completion_tokens == 0 and finals[2].usage.completion_tokens == 3


def test_a_long_prompt_does_not_hold_every_prefill_step(synth_model):
    """Two prompts evaluated at once (batch 512): a 1,500-token one submitted first, then a
    20-token one. The step's prefill budget is shared, shortest first, so the short prompt is
    answered first, while the long one is still being evaluated."""
    s = Scheduler.load([synth_model], LoadSettings(n_ctx=8192, n_threads=2), SchedulerSettings(parallel=2))
    try:
        order: list[str] = []

        def first(label):
            def on_event(ev) -> None:
                if isinstance(ev, TokenEvent) and label not in order:
                    order.append(label)
            return on_event
        long_prompt = (s.engine.prompt_for([{"role": "user", "content": "word " * 1500}]))[:1500]
        short_prompt = s.engine.prompt_for([{"role": "user", "content": "hi"}])
        greedy = Sampling(temperature=0)
        s.submit(Request(long_prompt, 2, sampling=greedy, ignore_eos=True), first("long"))
        s.submit(Request(short_prompt, 2, sampling=greedy, ignore_eos=True), first("short"))
        for _ in range(1200):
            if len(order) == 2:
                break
            time.sleep(0.05)
    finally:
        s.close()
    assert order == ["short", "long"]


@dataclass
class Slot:
    job: Job | None


def test_the_last_free_slot_is_kept_for_a_key_that_is_not_being_served():
    q = FairQueue()
    b = Job("B1", Request([1], tenant="b"))
    q.append(b)
    q.take(b)  # key b was admitted a moment ago; its request has finished since
    a = Job("A9", Request([1], tenant="a"))
    q.append(a)
    held_by_a = [Slot(Job("A1", Request([1], tenant="a"))), Slot(Job("A2", Request([1], tenant="a"))), Slot(None)]
    assert q.peek(held_by_a) is None  # kept for b, which holds no slot
    b2 = Job("B2", Request([1], tenant="b"))
    q.append(b2)
    assert q.peek(held_by_a) is b2  # ... and b's next request takes it, though it is a's turn
    q.remove(b2)
    serving_b = [Slot(Job("A1", Request([1], tenant="a"))), Slot(Job("B1", Request([1], tenant="b"))), Slot(None)]
    assert q.peek(serving_b) is a  # b is being served: nothing to keep
    two_free = [Slot(Job("A1", Request([1], tenant="a"))), Slot(None), Slot(None)]
    assert q.peek(two_free) is a  # only the last free slot is kept
    assert q.peek([Slot(None)]) is a  # a holds none: its request is admitted


def test_a_metered_answer_ends_only_once_its_row_is_written(one_slot, tmp_path):
    """A runner killed between an answer's end and its row's commit would have answered a
    request that was never metered: the final event waits for the row."""
    db = tmp_path / "keys.db"
    writer = UsageWriter(db)
    events: list = []
    ended = threading.Event()

    def on_event(ev):
        events.append(ev)
        if isinstance(ev, FinalEvent):
            ended.set()
    holder = sqlite3.connect(db, timeout=0)  # another process holding the database's write lock
    holder.execute("BEGIN IMMEDIATE")
    one_slot.meter = lambda req, final, then: writer.record(Row.of(req.tenant or "", "m", final), then)
    try:
        prompt = one_slot.engine.prompt_for([{"role": "user", "content": "hi"}])
        one_slot.submit(Request(prompt, 4, sampling=Sampling(temperature=0), ignore_eos=True, tenant="k"), on_event)
        for _ in range(600):  # bounded: four tokens come within seconds
            if sum(isinstance(ev, TokenEvent) for ev in events) == 4:
                break
            time.sleep(0.05)
        assert sum(isinstance(ev, TokenEvent) for ev in events) == 4
        assert not ended.wait(1.0)  # every token given, the answer not ended: its row is not written
        assert holder.execute("SELECT COUNT(*) FROM usage").fetchone()[0] == 0
        holder.rollback()  # the lock let go: the row is committed, then the answer ends
        assert ended.wait(60)
        assert holder.execute("SELECT key, completion_tokens FROM usage").fetchall() == [("k", 4)]
    finally:
        one_slot.meter = None
        holder.close()
        writer.close()
