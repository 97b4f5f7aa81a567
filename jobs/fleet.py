"""`tallow batch --endpoint URL [--endpoint URL2 ...]` (and `--ray`): a JSONL batch spread
over members that answer whole requests: servers here, a Ray cluster's actors in
jobs/ray_pool.py.

The output file is the single source of truth, as for a local batch (jobs/batch.py): one
thread writes it, a request's record is written once, whole, when its answer is complete
(or when it has failed for good), and a rerun skips the ids already there. Each line's body
goes to the server as it is (the server checks it); only `stream` is refused and a
`max_tokens` above --max-tokens is clamped.

Scheduling (docs/DESIGN.md, "Remote endpoints and fleets"):
- each endpoint takes up to `concurrency` requests at once;
- prefix affinity: the first `affinity_chars` characters of a prompt at least that long are
  its key; a key is pinned to one endpoint, the one with the fewest keys when it is first
  met (ties broken by rendezvous hashing), and moves only when that endpoint goes out of
  service, so requests sharing a long prefix meet a warm prompt cache; such a request
  waits for its endpoint, unless another endpoint is idle with no waiting request pinned
  to it (that one takes it, rather than sit idle; the summary counts those);
- 429, 5xx, a refused or lost connection: the request is tried again after a backoff
  (doubling from `backoff_s`, at most 30 s, or the server's Retry-After), up to `retries`
  times; a 4xx is the request's own fault and is recorded as its error at once;
- `down_after` failures in a row take an endpoint out for a cooldown (doubling while it
  keeps failing, at most 60 s); then one request probes it, and a success puts it back;
- a member whose target is not ready (a Ray actor being replaced) takes nothing, and keys
  pinned to it move; when no member has been ready for `stall_s` with requests waiting,
  the run stops with an error rather than wait for ever.
"""

from __future__ import annotations

import hashlib
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Protocol, TextIO

from tallow.client.endpoint import Call, Endpoint, RemoteError
from tallow.common.errors import TallowError
from tallow.jobs.records import BatchStats, Previous, Records, id_and_body, record_key
from tallow.runtime.types import FinalEvent
from tallow.wire.affinity import affinity_key
from tallow.wire.fields import APIError, parse_json


@dataclass(frozen=True)
class FleetSettings:
    concurrency: int = 8  # requests in flight per endpoint
    retries: int = 6  # further attempts of a request that failed in a way worth retrying
    backoff_s: float = 0.5
    affinity_chars: int = 512  # 0: no affinity
    down_after: int = 3  # consecutive failures that take an endpoint out
    cooldown_s: float = 5.0
    timeout_s: float = 600.0  # one request
    max_tokens: int | None = None  # clamp
    stall_s: float = 600.0  # no member ready this long, with requests waiting: the run fails
    n_allowed: bool = False  # members that answer n > 1 (an engine of their own, not a server's API)


@dataclass
class Answered:
    """A whole answer from a member: its record's fields after the id, and its counts."""

    record: dict[str, Any]
    completion_tokens: int
    prompt_tokens: int | None
    cached_tokens: int | None


class Target(Protocol):
    """What a member sends requests to: a server (HttpTarget), a Ray actor (jobs/ray_pool.py)."""

    name: str

    def ready(self) -> bool:
        """Whether it takes requests now (a server always does; failures are counted instead)."""
        ...

    def answer(self, job: Job, timeout: float) -> Answered:
        """The whole answer to `job`; RemoteError (retryable or not) when there is none."""
        ...


class HttpTarget:
    """An OpenAI-compatible server, streamed to (client/endpoint.py)."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint, self.name = endpoint, endpoint.url

    def ready(self) -> bool:
        return True

    def answer(self, job: Job, timeout: float) -> Answered:
        c = Call(self.endpoint, job.path, job.body, timeout)
        final = None
        for event in c.events():
            final = event
        assert isinstance(final, FinalEvent)
        record = {"text": final.text, **final.to_dict()}
        if c.reply.tool_calls:
            record["tool_calls"] = c.reply.tool_calls
        if c.reply.logprobs:
            record["logprobs"] = {"content": c.reply.logprobs}
        u = final.usage
        return Answered(record, u.completion_tokens, u.prompt_tokens, u.cached_tokens)


@dataclass
class Member:
    """One target's state in the fleet."""

    target: Target
    inflight: int = 0
    failures: int = 0  # in a row
    down_until: float = 0.0
    cooldown: float = 0.0
    done: int = 0
    retried: int = 0  # its failures that were tried again
    prompt_tokens: int = 0  # of the answers that reported cached tokens
    cached_tokens: int = 0
    reported: int = 0  # answers that reported cached tokens
    keys: int = 0  # prefix keys pinned to it

    def in_service(self, now: float) -> bool:
        return self.down_until <= now and self.target.ready()

    def room(self, now: float, concurrency: int) -> bool:
        if not self.in_service(now):
            return False
        probing = self.failures >= 1 and self.cooldown > 0  # back from a cooldown: one request at a time
        return self.inflight < (1 if probing else concurrency)


@dataclass
class Job:
    lineno: int
    rid: Any
    path: str
    body: dict[str, Any]
    key: str | None  # affinity key, None: any endpoint
    attempts: int = 0
    not_before: float = 0.0
    last_error: str = ""
    away: bool = False  # sent to a member other than its key's (an idle one took it)


@dataclass
class FleetStats(BatchStats):
    members: list[Member] = field(default_factory=list)
    holders: str = "servers"  # what holds the prompt caches, as the summary names them
    keyed: int = 0  # answered requests with a prefix key
    away: int = 0  # of those, answered by a member other than the one their key is pinned to

    def cache_line(self) -> str:
        reported = [m for m in self.members if m.reported]
        if not reported:
            return "prompt cache: not reported by the servers"
        prompt = sum(m.prompt_tokens for m in reported)
        cached = sum(m.cached_tokens for m in reported)
        share = cached / prompt if prompt else 0.0
        return f"prompt cache: {cached} of {prompt} prompt tokens ({share:.0%}) served from the {self.holders}' caches"

    def affinity_line(self) -> str:
        """How far prefix affinity held this run; empty when no request had a prefix key."""
        if not self.keyed:
            return ""
        return (f"prefix affinity: {self.keyed - self.away} of {self.keyed} requests answered where their prefix "
                f"is pinned, {self.away} by an idle one")


def rendezvous(key: str, members: list[Member]) -> list[Member]:
    """Members in the order of preference for `key` (highest random weight first): removing
    one moves only its own keys."""
    return sorted(members, key=lambda m: hashlib.sha256(f"{key}|{m.target.name}".encode()).digest(), reverse=True)


def parse_line(lineno: int, text: str, model: str, cap: int | None, affinity_chars: int,
               n_allowed: bool = False) -> Job:
    """A batch line as a job for a member; raises APIError for a line that cannot be sent."""
    rid, body = id_and_body(parse_json(text.encode("utf-8"), "the line"))
    path = "/chat/completions" if "messages" in body else "/completions" if "prompt" in body else None
    if path is None:
        raise APIError("the line needs 'messages' (a chat) or 'prompt' (a text completion)", param="messages")
    if body.get("stream"):
        raise APIError("'stream' has no meaning in a batch", param="stream")
    if body.get("n") not in (None, 1) and not n_allowed:
        raise APIError("'n' above 1 is answered by a local batch (without --endpoint), not through a fleet", param="n")
    body = {"model": model, **body}
    for name in ("max_tokens", "max_completion_tokens"):
        if cap is not None and isinstance(body.get(name), int) and body[name] > cap:
            body[name] = cap
    return Job(lineno, rid, path, body, affinity_key(body, affinity_chars))


class Fleet:
    def __init__(self, targets: list[Target], settings: FleetSettings, model: str) -> None:
        self.settings, self.model = settings, model
        self.members = [Member(t) for t in targets]
        self.pins: dict[str, Member] = {}  # prefix key -> its endpoint
        self.clock = time.monotonic

    def pinned(self, key: str, now: float) -> Member | None:
        """The endpoint a prefix key is pinned to: chosen once, among those in service, as the
        one with the fewest keys (ties: rendezvous order), and moved only when it goes out."""
        member = self.pins.get(key)
        if member is not None and member.in_service(now):
            return member
        in_service = [m for m in self.members if m.in_service(now)]
        if not in_service:
            return None
        if member is not None:
            member.keys -= 1
        member = min(rendezvous(key, in_service), key=lambda m: m.keys)  # min keeps the first of equals
        member.keys += 1
        self.pins[key] = member
        return member

    def choose(self, job: Job, now: float, wanted: set[int]) -> Member | None:
        """Where `job` goes now, or None to wait. `wanted`: the members some waiting job is pinned to."""
        open_ = [m for m in self.members if m.room(now, self.settings.concurrency)]
        if not open_:
            return None
        if job.key is None:
            return min(open_, key=lambda m: (m.inflight, m.done))
        member = self.pinned(job.key, now)
        if member in open_:
            return member
        # Work stealing: an idle endpoint that no waiting job is pinned to would otherwise sit idle.
        idle = [m for m in open_ if m.inflight == 0 and id(m) not in wanted]
        return idle[0] if idle else None

    def failed(self, member: Member, now: float) -> None:
        member.failures += 1
        if member.down_until > now:  # out already: the other calls it had in flight do not lengthen that
            return
        if member.failures >= self.settings.down_after or member.cooldown > 0:
            member.cooldown = min(60.0, member.cooldown * 2 if member.cooldown else self.settings.cooldown_s)
            member.down_until = now + member.cooldown

    def succeeded(self, member: Member) -> None:
        member.failures, member.cooldown, member.down_until = 0, 0.0, 0.0

    def run(self, source: Iterable[tuple[int, str]], out: TextIO, previous: Previous, stats: FleetStats,
            on_progress: Callable[[FleetStats], None] = lambda s: None) -> FleetStats:
        """Answer every request of `source` not already in the output; records as they finish."""
        stats.members = self.members
        FleetRun(self, source, Records(out, stats, on_progress), previous, stats, on_progress).loop()
        return stats


class FleetRun:
    """One run of a fleet over one input: the lines not read yet, the jobs waiting, retrying
    and in flight, and the calls' results, which only this (the writer's) thread takes."""

    def __init__(self, fleet: Fleet, source: Iterable[tuple[int, str]], records: Records, previous: Previous,
                 stats: FleetStats, on_progress: Callable[[FleetStats], None]) -> None:
        self.fleet, self.settings, self.records, self.previous = fleet, fleet.settings, records, previous
        self.stats, self.on_progress = stats, on_progress
        self.results: queue.Queue = queue.Queue()
        self.waiting: deque[Job] = deque()
        self.retry: list[Job] = []
        self.inflight: dict[int, tuple[Job, Member]] = {}
        self.seen: set[str] = set()
        self.lines = iter(source)
        self.exhausted = False
        self.window = max(4, 2 * self.settings.concurrency * len(fleet.members))
        self.last_ready = fleet.clock()
        self.dispatched = False

    def loop(self) -> None:
        while True:
            while not self.exhausted and len(self.waiting) + len(self.retry) < self.window:
                self.take_line()
            now = self.fleet.clock()
            self.check_stall(now)
            self.dispatch(now)
            if self.exhausted and not self.waiting and not self.retry and not self.inflight:
                return
            due = [j.not_before for j in self.retry] + [m.down_until for m in self.fleet.members if m.down_until > now]
            try:
                self.finish(*self.results.get(timeout=max(0.01, min([0.5] + [d - now for d in due]))))
            except queue.Empty:
                continue
            while True:  # everything else that finished meanwhile
                try:
                    self.finish(*self.results.get_nowait())
                except queue.Empty:
                    break

    def check_stall(self, now: float) -> None:
        """Fail the run when requests wait and no member has been ready for `stall_s`."""
        if not self.waiting or any(m.target.ready() for m in self.fleet.members):
            self.last_ready = now
        elif now - self.last_ready > self.settings.stall_s:
            names = ", ".join(m.target.name for m in self.fleet.members)
            raise TallowError(f"no member has taken requests for {self.settings.stall_s:.0f} s ({names})",
                              "the records written so far are kept: run the same command again to go on")

    def dispatch(self, now: float) -> None:
        """Retries that are due go first; then each waiting job to the member it may go to now."""
        for job in [j for j in self.retry if j.not_before <= now]:
            self.retry.remove(job)
            self.waiting.appendleft(job)
        fleet = self.fleet
        wanted = {id(m) for m in (fleet.pinned(j.key, now) for j in self.waiting if j.key) if m is not None}
        for job in list(self.waiting):
            member = fleet.choose(job, now, wanted)
            if member is None:
                continue
            self.waiting.remove(job)
            job.away = job.key is not None and fleet.pins.get(job.key) is not member
            if not self.dispatched:  # the rate counts from the first request, as a local batch's
                self.dispatched, self.stats.started = True, time.perf_counter()  # (members' start-up excluded)
            member.inflight += 1
            self.inflight[job.lineno] = (job, member)
            # A daemon thread per call: an interrupted batch exits at once, without waiting
            # for the calls in flight (their answers are not written).
            threading.Thread(target=self.call, args=(job, member), name="tallow-fleet", daemon=True).start()

    def call(self, job: Job, member: Member) -> None:
        """One request to one member, on a thread of its own; the outcome goes to `results`."""
        try:
            self.results.put((job.lineno, member.target.answer(job, self.settings.timeout_s)))
        except RemoteError as exc:
            self.results.put((job.lineno, exc))
        except Exception as exc:  # noqa: BLE001 - any other fault of one call must not stop the batch
            self.results.put((job.lineno, RemoteError(f"{type(exc).__name__}: {exc}", retryable=True)))

    def take_line(self) -> None:
        """The next input line: a job waiting, an error record, or a request answered before."""
        try:
            lineno, text = next(self.lines)
        except StopIteration:
            self.exhausted = True
            return
        if not text.strip():
            return
        s, stats, previous = self.settings, self.stats, self.previous
        rid = None
        try:
            job = parse_line(lineno, text, self.fleet.model, s.max_tokens, s.affinity_chars, s.n_allowed)
            rid, key = job.rid, record_key(job.rid)
            if key in self.seen:
                raise APIError(f"the id {key} appears twice in the input")
            self.seen.add(key)
        except TallowError as exc:
            if lineno in previous.failed_lines:
                stats.failed_before += 1
                self.on_progress(stats)
            else:
                self.records.error(lineno, rid, f"line {lineno}: {exc.message}")
            return
        if key in previous.ids or key in previous.failed_ids:
            stats.skipped += key in previous.ids
            stats.failed_before += key not in previous.ids
            self.on_progress(stats)
            return
        self.waiting.append(job)

    def finish(self, lineno: int, outcome: Answered | RemoteError) -> None:
        job, member = self.inflight.pop(lineno)
        member.inflight -= 1
        if isinstance(outcome, RemoteError):
            self.failed(job, member, outcome)
        else:
            self.fleet.succeeded(member)
            self.answered(job, member, outcome)

    def failed(self, job: Job, member: Member, outcome: RemoteError) -> None:
        """A failed call: retried with backoff when it may succeed elsewhere or later, else the
        request's error record."""
        s, now = self.settings, self.fleet.clock()
        if not outcome.retryable:
            self.records.error(job.lineno, job.rid, f"line {job.lineno}: {outcome.message}")
            return
        self.fleet.failed(member, now)
        job.attempts += 1
        job.last_error = outcome.message
        if job.attempts > s.retries:
            self.records.error(job.lineno, job.rid, f"line {job.lineno}: gave up after {job.attempts} attempts: "
                                                    f"{outcome.message}")
            return
        member.retried += 1
        wait = outcome.retry_after if outcome.retry_after is not None else \
            min(30.0, s.backoff_s * 2 ** (job.attempts - 1))
        job.not_before = now + wait
        self.retry.append(job)

    def answered(self, job: Job, member: Member, outcome: Answered) -> None:
        """A whole answer: its record written, the member's and the run's counts updated."""
        record = {"id": job.rid, **outcome.record}
        if job.attempts:
            record["attempts"] = job.attempts + 1
        self.records.write(record)
        member.done += 1
        if outcome.cached_tokens is not None and outcome.prompt_tokens is not None:
            member.reported += 1
            member.prompt_tokens += outcome.prompt_tokens
            member.cached_tokens += outcome.cached_tokens
        self.stats.done += 1
        self.stats.keyed += job.key is not None
        self.stats.away += job.away
        self.stats.completion_tokens += outcome.completion_tokens
        self.on_progress(self.stats)
