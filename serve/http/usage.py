"""Metered usage: every request of a key-checked server, recorded as it ends, and read back.

Runners write (each request's row, from the scheduler's final event, on a writer thread of
their own so the engine never waits on the disk); the front reads the rows as they arrive
(`UsageTail`: token buckets and per-key /metrics); `tallow usage` sums them. A request's answer
ends only once its row is committed (`record`'s `then`, `durable`), so a killed process loses
the requests in flight, never a row of an answer given. The database is in WAL mode and the
writer commits with synchronous=NORMAL: a commit is a write to the log, no fsync (17 us, against
0.9 ms for a rollback journal's fsyncs), which outlives the process though not the machine's power.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import fnmatch
import json
import queue
import sqlite3
import threading
import time
from dataclasses import astuple, dataclass
from pathlib import Path
from typing import Any, Callable

from tallow.common.errors import TallowError
from tallow.runtime.history import migrate
from tallow.runtime.types import FinalEvent

COUNTS = ("prompt_tokens", "cached_tokens", "completion_tokens", "reasoning_tokens", "media_tokens", "audio_ms")
GROUPS = {"key": "key", "model": "model", "day": "date(created, 'unixepoch')"}
PRICE_FIELDS = ("input", "cached_input", "output")


@dataclass(frozen=True)
class Row:
    key: str
    model: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    reasoning_tokens: int
    media_tokens: int
    audio_ms: int  # audio transcribed (speech to text is metered by what it heard)
    duration_ms: float
    finish_reason: str
    created: float
    request: str | None = None  # the server's id of the request (its journal's, X-Request-Id)

    @classmethod
    def of(cls, key: str, model: str, final: FinalEvent, request: str | None = None) -> Row:
        u = final.usage
        return cls(key, model, u.prompt_tokens or 0, u.cached_tokens or 0, u.completion_tokens, u.reasoning_tokens,
                   u.media_tokens, 0, round(final.timings.total_ms, 3), final.finish_reason, time.time(), request)

    @classmethod
    def embedded(cls, key: str, model: str, input_tokens: int, duration_ms: float, request: str | None = None) -> Row:
        """An embedding or rerank request's row: its input tokens."""
        return cls(key, model, input_tokens, 0, 0, 0, 0, 0, round(duration_ms, 3), "stop", time.time(), request)

    @classmethod
    def heard(cls, key: str, model: str, audio_s: float, duration_ms: float, request: str | None = None) -> Row:
        """A transcription's row: the audio it heard, no tokens."""
        return cls(key, model, 0, 0, 0, 0, 0, round(audio_s * 1000), round(duration_ms, 3), "stop", time.time(),
                   request)


INSERT = (f"INSERT INTO usage (key, model, {', '.join(COUNTS)}, duration_ms, finish_reason, created, request) "
          "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")


def connect(path: Path | str) -> sqlite3.Connection:
    db = sqlite3.connect(str(path), timeout=5.0, check_same_thread=False)
    migrate(db)
    return db


class UsageWriter:
    """Rows written by a thread of their own: those queued together committed together, and
    each row's `then` called once its row is in the database."""

    def __init__(self, path: Path | str) -> None:
        self.path = path
        self.rows: queue.Queue[tuple[Row, Callable[[], None] | None] | None] = queue.Queue()
        db = connect(path)  # the tables exist before the first request
        try:  # kept by the file: readers never wait for the writer, and a commit needs no fsync
            db.execute("PRAGMA journal_mode=WAL")
        except sqlite3.OperationalError:
            pass  # another process mid-transaction past the timeout: it is only faster, not safer
        finally:
            db.close()
        self.thread = threading.Thread(target=self._write, name="tallow-usage", daemon=True)
        self.thread.start()

    def record(self, row: Row, then: Callable[[], None] | None = None) -> None:
        """Queue the row; `then` runs on the writer's thread once it is committed (or, should the
        database stay locked for a minute, once that was given up)."""
        self.rows.put((row, then))

    def written(self, row: Row, timeout: float = 90.0) -> None:
        """Record the row and wait on this thread until it is committed."""
        committed = threading.Event()
        self.record(row, committed.set)
        committed.wait(timeout)

    async def durable(self, row: Row) -> None:
        """Record the row and wait until it is committed."""
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        def committed() -> None:
            loop.call_soon_threadsafe(done.set_result, None)
        self.record(row, committed)
        await done

    def _write(self) -> None:
        db = connect(self.path)
        db.execute("PRAGMA synchronous=NORMAL")
        closing = False
        while not closing:
            batch = [self.rows.get()]
            while not self.rows.empty() and batch[-1] is not None:
                batch.append(self.rows.get_nowait())
            closing = batch[-1] is None
            items = [item for item in batch if item is not None]
            self._commit(db, [row for row, _ in items])
            for _, then in items:
                try:
                    if then is not None:
                        then()
                except Exception:  # pragma: no cover - a closed event loop: its answer has no one to go to
                    pass
        db.close()

    @staticmethod
    def _commit(db: sqlite3.Connection, rows: list[Row]) -> None:
        for _ in range(12):  # another process holding the write lock past the 5 s timeout: try again
            try:
                with db:
                    db.executemany(INSERT, [astuple(row) for row in rows])
                return
            except sqlite3.OperationalError:
                time.sleep(0.05)

    def close(self) -> None:
        self.rows.put(None)
        self.thread.join(10)


class UsageTail:
    """The rows written since this tail was made, as they arrive."""

    def __init__(self, path: Path | str) -> None:
        self.db = connect(path)
        self.last = self.db.execute("SELECT COALESCE(MAX(id), 0) FROM usage").fetchone()[0]

    def new_rows(self) -> list[Row]:
        rows = self.db.execute(f"SELECT id, key, model, {', '.join(COUNTS)}, duration_ms, finish_reason, created "
                               "FROM usage WHERE id > ? ORDER BY id", (self.last,)).fetchall()
        if rows:
            self.last = rows[-1][0]
        return [Row(*r[1:]) for r in rows]


def summarize(path: Path | str, by: str = "key", key: str | None = None, model: str | None = None,
              since: float | None = None) -> list[dict[str, Any]]:
    """Totals grouped by key, model or day (UTC), newest day first; filters by key, model
    (a shell pattern) and start time."""
    where: list[str] = []
    args: list[Any] = []
    if key is not None:
        where.append("key = ?")
        args.append(key)
    if since is not None:
        where.append("created >= ?")
        args.append(since)
    db = connect(path)
    try:
        sql = (f"SELECT {GROUPS[by]} AS grp, model, COUNT(*), " + ", ".join(f"SUM({c})" for c in COUNTS) +
               ", SUM(duration_ms) FROM usage" + (" WHERE " + " AND ".join(where) if where else "") +
               f" GROUP BY {GROUPS[by]}, model")
        rows = db.execute(sql, args).fetchall()
    finally:
        db.close()
    out: dict[str, dict[str, Any]] = {}
    for grp, row_model, n, *sums in rows:
        if model is not None and not fnmatch.fnmatchcase(row_model, model):
            continue
        total = out.setdefault(grp, {by: grp, "requests": 0, **{c: 0 for c in COUNTS}, "duration_ms": 0.0,
                                     "models": {}})
        total["requests"] += n
        for c, v in zip(COUNTS, sums[:-1]):
            total[c] += v or 0
        total["duration_ms"] += sums[-1] or 0.0
        total["models"][row_model] = {"requests": n, **dict(zip(COUNTS, (v or 0 for v in sums[:-1])))}
    return sorted(out.values(), key=lambda t: t[by], reverse=by == "day")


def parse_since(text: str) -> float:
    """A date, an ISO time (UTC unless it says), or a span back from now: 30m, 24h, 7d."""
    text = text.strip()
    units = {"m": 60, "h": 3600, "d": 86400}
    if text[:-1].isdigit() and text[-1:] in units:
        return time.time() - int(text[:-1]) * units[text[-1]]
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise TallowError(f"'{text}' is not a time", "give YYYY-MM-DD, an ISO time, or a span such as 24h or 7d") from None
    return (when if when.tzinfo else when.replace(tzinfo=dt.timezone.utc)).timestamp()


def load_prices(path: Path) -> list[tuple[str, dict[str, float]]]:
    """A prices file: a JSON object of model patterns, each {input, cached_input, output} in
    money per million tokens; the first pattern that matches a model prices it."""
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise TallowError(f"cannot read {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise TallowError(f"{path} is not JSON: {exc}") from None
    if not isinstance(data, dict) or not data:
        raise TallowError(f"{path} must be a JSON object of model patterns, each with {', '.join(PRICE_FIELDS)}")
    out = []
    for pattern, price in data.items():
        if not isinstance(price, dict) or set(price) != set(PRICE_FIELDS) or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in price.values()):
            raise TallowError(f"{path}: '{pattern}' must give {', '.join(PRICE_FIELDS)}, each a number >= 0 "
                              "(per million tokens)")
        out.append((pattern, {k: float(v) for k, v in price.items()}))
    return out


def cost(counts: dict[str, Any], model: str, prices: list[tuple[str, dict[str, float]]]) -> float | None:
    """What the tokens would cost at the first matching price: cached input at its own price,
    the rest of the input at the input price, completion (reasoning included) at the output price."""
    for pattern, price in prices:
        if fnmatch.fnmatchcase(model, pattern):
            fresh = counts["prompt_tokens"] - counts["cached_tokens"]
            return (fresh * price["input"] + counts["cached_tokens"] * price["cached_input"]
                    + counts["completion_tokens"] * price["output"]) / 1e6
    return None
