"""Offline batch inference: a JSONL file of requests through the scheduler, results appended
line by line to another JSONL file, resumable.

Each input line is a request object as the server takes it ({"id", "messages"} or
{"id", "prompt"}, with the same optional settings), or an OpenAI Batch API line
({"custom_id", "body"}). Each output line is written whole and flushed, so a run that is
killed loses only the requests in flight, and running again skips ids already written.
"""

from __future__ import annotations

import queue
from functools import partial
from typing import Any, Callable, Iterable, TextIO

from tallow.common.errors import TallowError
from tallow.jobs.records import BatchStats, Previous, Records, id_and_body, record_key
from tallow.runtime.answer import Answer
from tallow.runtime.intake import to_request
from tallow.runtime.logprobs import token_logprob
from tallow.runtime.scheduling.forks import merged, submit_forks
from tallow.runtime.scheduling.handle import Failure
from tallow.runtime.scheduling.scheduler import Scheduler
from tallow.runtime.types import FinalEvent
from tallow.wire.fields import APIError, parse_json
from tallow.wire.openai_api import parse_chat, parse_completion
from tallow.wire.request import Limits


def run_batch(sched: Scheduler, source: Iterable[tuple[int, str]], out: TextIO, limits: Limits,
              previous: Previous, stats: BatchStats,
              on_progress: Callable[[BatchStats], None] = lambda s: None) -> BatchStats:
    """Run every request of `source` ((line number, text) pairs) not already in the output,
    answered or failed, keeping the scheduler's slots full; write a record per request to
    `out` as each finishes."""
    engine = sched.engine
    results: queue.Queue = queue.Queue()
    in_flight: dict[int, tuple[Any, list, Any, dict]] = {}  # line number -> (id, handles, tool choice, finals)
    window = max(2, len(sched.slots) * 2)  # enough waiting to refill slots, without queueing the file
    seen: set[str] = set()  # ids met in this input so far
    records = Records(out, stats, on_progress)
    write, error = records.write, records.error

    def collect(block: bool) -> None:
        while in_flight:
            try:
                job, event, entries = results.get(block=block)
            except queue.Empty:
                return
            block = False
            (job, index) = job
            if job not in in_flight:  # a fork of a line that failed already
                continue
            if isinstance(event, Failure):
                rid, handles, _, _ = in_flight.pop(job)
                for h in handles:
                    h.cancel()
                error(job, rid, f"line {job}: {event.error.message}")
            elif isinstance(event, FinalEvent):
                rid, handles, choice, finals = in_flight[job]
                finals[index] = (event, entries)
                if len(finals) < len(handles):
                    continue
                del in_flight[job]
                write(record(rid, choice, [finals[i] for i in range(len(handles))]))
                stats.done += 1
                stats.completion_tokens += sum(f.usage.completion_tokens for f, _ in finals.values())
                on_progress(stats)

    try:
        for lineno, text in source:
            if not text.strip():
                continue
            rid = None
            try:
                body = parse_json(text.encode("utf-8"), "the line")
                rid, body = id_and_body(body)
                key = record_key(rid)
                if key in seen:
                    raise APIError(f"the id {key} appears twice in the input")
                seen.add(key)
                if key in previous.ids or key in previous.failed_ids:  # answered, or failed, before
                    stats.skipped += key in previous.ids
                    stats.failed_before += key not in previous.ids
                    on_progress(stats)
                    continue
                parsed, request = prepare(engine, body, limits)
            except TallowError as exc:
                if lineno in previous.failed_lines:  # said already: not written twice
                    stats.failed_before += 1
                    on_progress(stats)
                else:
                    error(lineno, rid, f"line {lineno}: {exc.message}")
                continue
            while len(in_flight) >= window:
                collect(block=True)
            try:  # n choices: forks after one prefill
                handles = submit_forks(sched, request, parsed.n, partial(_ends_to, results, lineno, engine.model.piece,
                                                                        request.logprobs is not None))
            except TallowError as exc:
                error(lineno, rid, f"line {lineno}: {exc.message}")
                continue
            in_flight[lineno] = (rid, handles, parsed.tools, {})
            collect(block=False)
        while in_flight:
            collect(block=True)
    finally:
        for _, handles, _, _ in in_flight.values():  # interrupted: nothing half-done is written
            for h in handles:
                h.cancel()
    return stats


def prepare(engine, body: dict[str, Any], limits: Limits):
    """(the parsed line, the engine's request) for a line's body; APIError for a bad one."""
    if body.get("stream"):
        raise APIError("'stream' has no meaning in a batch", param="stream")
    parsed = parse_chat(body, limits) if "messages" in body else parse_completion(body, limits)
    return parsed, to_request(engine, parsed)


def answer_body(sched: Scheduler, body: dict[str, Any], limits: Limits, timeout: float) -> dict[str, Any]:
    """One line's record, less its id, the caller waiting for it (a Ray actor's call, one
    thread each); raises TallowError for a line that fails, as run_batch records it."""
    parsed, request = prepare(sched.engine, body, limits)
    results: queue.Queue = queue.Queue()
    handles = submit_forks(sched, request, parsed.n, partial(_ends_to, results, 0, sched.engine.model.piece,
                                                             request.logprobs is not None))
    finals: dict[int, tuple[FinalEvent, Any]] = {}
    try:
        while len(finals) < len(handles):
            (_, index), event, entries = results.get(timeout=timeout)
            if isinstance(event, Failure):
                raise event.error
            finals[index] = (event, entries)
    except queue.Empty:
        raise TallowError(f"no answer in {timeout:.0f} s") from None
    finally:
        for h in handles:
            h.cancel()
    return {k: v for k, v in record(None, parsed.tools, [finals[i] for i in range(len(handles))]).items() if k != "id"}


def record(rid: Any, choice, finals: list[tuple[FinalEvent, Any]]) -> dict[str, Any]:
    """A line's record: its answer; with n > 1, a list of choices and the usage merged."""
    def one(final: FinalEvent, entries) -> dict[str, Any]:
        out = {"text": final.text, **final.to_dict(), **tool_fields(choice, final)}
        if entries is not None:
            out["logprobs"] = {"content": entries}
        return out

    if len(finals) == 1:
        return {"id": rid, **one(*finals[0])}
    choices = [{"index": i, **{k: v for k, v in one(f, e).items() if k not in ("usage", "timings")}}
               for i, (f, e) in enumerate(finals)]
    whole = merged([f for f, _ in finals])
    return {"id": rid, "choices": choices, "usage": whole.to_dict()["usage"], "timings": whole.timings.summary()}


def tool_fields(choice, final: FinalEvent) -> dict[str, Any]:
    """A record's calls, when its request offered tools (as a chat answer's message has them)."""
    if choice is None:
        return {}
    outcome = Answer(choice).whole(final)
    out: dict[str, Any] = {"finish_reason": outcome.finish_reason,
                           "tool_calls": [{"id": cid, "type": "function", "function": {"name": n, "arguments": a}}
                                          for cid, n, a in outcome.calls]}
    if outcome.error:
        out["tool_call_error"] = outcome.error
    return out


def _ends_to(results: queue.Queue, lineno: int, piece, logprobs: bool, index: int) -> Callable:
    """An event callback that passes on how choice `index` of line `lineno` ended (a batch
    writes whole records, so its per-token events would be queued just to be dropped), with
    the tokens' log-probabilities when the request asked for them (as the API gives them)."""
    entries: list[dict[str, Any]] = []

    def on_event(event) -> None:
        if isinstance(event, (FinalEvent, Failure)):
            results.put(((lineno, index), event, entries if logprobs else None))
        elif logprobs and event.logprob is not None:
            entries.append(token_logprob(event, piece))

    return on_event
