"""Offline batch inference: a JSONL file of requests through the scheduler, results appended
line by line to another JSONL file, resumable.

Each input line is a request object as the server takes it ({"id", "messages"} or
{"id", "prompt"}, with the same optional settings), or an OpenAI Batch API line
({"custom_id", "body"}). Each output line is written whole and flushed, so a run that is
killed loses only the requests in flight, and running again skips ids already written.
"""

from __future__ import annotations

import json
import os
import queue
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, TextIO

from tallow.common.errors import TallowError
from tallow.runtime.scheduler import Failure, Scheduler
from tallow.runtime.types import FinalEvent

from .answer import Answer
from .openai_api import APIError, Limits, parse_chat, parse_completion, parse_json, to_request, token_logprob


@dataclass
class BatchStats:
    total: int = 0  # request lines in the input
    skipped: int = 0  # already answered in the output
    failed_before: int = 0  # whose error record is already in the output (not run again)
    done: int = 0
    failed: int = 0  # error records written this run
    completion_tokens: int = 0
    started: float = field(default_factory=time.perf_counter)

    @property
    def tokens_per_s(self) -> float:
        elapsed = time.perf_counter() - self.started
        return self.completion_tokens / elapsed if elapsed > 0 else 0.0


@dataclass
class Previous:
    """What an earlier run left in the output: answered requests and failed ones."""

    ids: set[str] = field(default_factory=set)  # answered
    failed_ids: set[str] = field(default_factory=set)  # an error record, and no answer since
    failed_lines: set[int] = field(default_factory=set)  # input lines with an error record


def previous_results(out: Path, retry_failed: bool = False) -> Previous:
    """What `out` already holds. A last line cut short by a kill is removed, so its request
    runs again and the file stays valid JSONL. With `retry_failed`, error records are taken
    out of the file (rewritten whole, then renamed over it), so those requests run again."""
    found = Previous()
    if not out.exists():
        return found
    from tallow.common.files import trim_partial_line

    trim_partial_line(out)
    data = out.read_bytes()
    end = len(data)
    kept: list[bytes] = []
    for raw in data[:end].splitlines(keepends=True):
        try:
            record = json.loads(raw)
        except ValueError:
            kept.append(raw)
            continue
        if not isinstance(record, dict):
            kept.append(raw)
            continue
        failed = "error" in record
        if failed and retry_failed:
            continue
        kept.append(raw)
        if record.get("id") is not None:
            (found.failed_ids if failed else found.ids).add(record_key(record["id"]))
        if failed and isinstance(record.get("line"), int):
            found.failed_lines.add(record["line"])
    found.failed_ids -= found.ids
    if retry_failed and len(kept) != len(data[:end].splitlines()):
        from tallow.common.files import write_atomic

        write_atomic(out, b"".join(kept))
    return found


def record_key(value: Any) -> str:
    """An id as the output file's records are matched on (1 and "1" differ)."""
    return json.dumps(value)


class Records:
    """The output file's one writer: each record one whole line, flushed as it is written."""

    def __init__(self, out: TextIO, stats: BatchStats, on_progress: Callable[[BatchStats], None]) -> None:
        self.out, self.stats, self.on_progress = out, stats, on_progress

    def write(self, record: dict[str, Any]) -> None:
        self.out.write(json.dumps(record, ensure_ascii=False) + "\n")
        self.out.flush()

    def error(self, lineno: int, rid: Any, message: str) -> None:
        self.write({"id": rid, "line": lineno, "error": message})
        self.stats.failed += 1
        self.on_progress(self.stats)


def count_requests(path: Path) -> int:
    with open(path, "rb") as f:
        return sum(1 for raw in f if raw.strip())


def run_batch(sched: Scheduler, source: Iterable[tuple[int, str]], out: TextIO, limits: Limits,
              previous: Previous, stats: BatchStats,
              on_progress: Callable[[BatchStats], None] = lambda s: None) -> BatchStats:
    """Run every request of `source` ((line number, text) pairs) not already in the output,
    answered or failed, keeping the scheduler's slots full; write a record per request to
    `out` as each finishes."""
    engine = sched.engine
    results: queue.Queue = queue.Queue()
    in_flight: dict[int, tuple[Any, Any, Any]] = {}  # line number -> (id, handle, tool choice)
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
            if isinstance(event, Failure):
                rid, _, _ = in_flight.pop(job)
                error(job, rid, f"line {job}: {event.error.message}")
            elif isinstance(event, FinalEvent):
                rid, _, choice = in_flight.pop(job)
                record = {"id": rid, "text": event.text, **event.to_dict(), **tool_fields(choice, event)}
                if entries is not None:
                    record["logprobs"] = {"content": entries}
                write(record)
                stats.done += 1
                stats.completion_tokens += event.usage.completion_tokens
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
                if body.get("stream"):
                    raise APIError("'stream' has no meaning in a batch", param="stream")
                parsed = parse_chat(body, limits) if "messages" in body else parse_completion(body, limits)
                request = to_request(engine, parsed)
            except TallowError as exc:
                if lineno in previous.failed_lines:  # said already: not written twice
                    stats.failed_before += 1
                    on_progress(stats)
                else:
                    error(lineno, rid, f"line {lineno}: {exc.message}")
                continue
            while len(in_flight) >= window:
                collect(block=True)
            try:
                handle = sched.submit(request, on_event=_ends_to(results, lineno, engine.model.piece,
                                                                 request.logprobs is not None))
            except TallowError as exc:
                error(lineno, rid, f"line {lineno}: {exc.message}")
                continue
            in_flight[lineno] = (rid, handle, parsed.tools)
            collect(block=False)
        while in_flight:
            collect(block=True)
    finally:
        for _, handle, _ in in_flight.values():  # interrupted: nothing half-done is written
            handle.cancel()
    return stats


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


def _ends_to(results: queue.Queue, lineno: int, piece, logprobs: bool) -> Callable:
    """An event callback that passes on how a request ended (a batch writes whole records, so
    its per-token events would be queued just to be dropped), with the tokens'
    log-probabilities when the request asked for them (as the API gives them)."""
    entries: list[dict[str, Any]] = []

    def on_event(event) -> None:
        if isinstance(event, (FinalEvent, Failure)):
            results.put((lineno, event, entries if logprobs else None))
        elif logprobs and event.logprob is not None:
            entries.append(token_logprob(event, piece))

    return on_event


def id_and_body(line: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    if "custom_id" in line and isinstance(line.get("body"), dict):  # OpenAI's Batch API format
        rid, body = line["custom_id"], line["body"]
    else:
        rid, body = line.get("id"), {k: v for k, v in line.items() if k != "id"}
    if isinstance(rid, bool) or not isinstance(rid, (str, int)) or rid == "":
        raise APIError("each line needs an 'id' (a string or an integer)", param="id")
    return rid, body


def read_lines(path: Path) -> Iterable[tuple[int, str]]:
    """(line number, text) of a file read as UTF-8 (bad bytes become U+FFFD, then fail to parse)."""
    with open(path, "r", encoding="utf-8", errors="replace", newline="\n") as f:
        for n, line in enumerate(f, 1):
            yield n, line


def open_output(path: Path) -> TextIO:
    """The output, opened to append (the previous run's records stay)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    return os.fdopen(fd, "w", encoding="utf-8", newline="\n")
