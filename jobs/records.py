"""A batch's output file, the only state of a batch job, local or over a fleet: what an
earlier run left in it, the one writer of its records, and the input lines' ids."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, TextIO

from tallow.wire.fields import APIError


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

    def __init__(self, out: TextIO, stats: BatchStats, on_progress: Callable[[Any], None]) -> None:
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
