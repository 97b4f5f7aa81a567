"""The local history log: every run and chat turn in one SQLite database.

Nothing here ever leaves the machine. Schema changes are plain numbered functions,
recorded in a table as they are applied (the convention of simonw/llm).
"""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from tallow.runtime.media import restored, stored
from tallow.runtime.types import FinalEvent


def m001_initial(db: sqlite3.Connection) -> None:
    db.execute("""CREATE TABLE conversations (
        id TEXT PRIMARY KEY, model TEXT NOT NULL, created REAL NOT NULL)""")
    db.execute("""CREATE TABLE responses (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        conversation_id TEXT NOT NULL REFERENCES conversations(id),
        model TEXT NOT NULL, system TEXT, prompt TEXT NOT NULL, response TEXT NOT NULL,
        finish_reason TEXT, prompt_tokens INTEGER, cached_tokens INTEGER,
        completion_tokens INTEGER, timings TEXT, created REAL NOT NULL)""")
    db.execute("CREATE INDEX responses_conversation ON responses(conversation_id, id)")


def m002_reasoning(db: sqlite3.Connection) -> None:
    db.execute("ALTER TABLE responses ADD COLUMN reasoning TEXT")
    db.execute("ALTER TABLE responses ADD COLUMN reasoning_tokens INTEGER")


def m003_api_responses(db: sqlite3.Connection) -> None:
    # Responses API objects kept for previous_response_id: the response as returned, and the
    # whole conversation it ends (its input and output as messages), so continuing it is one
    # lookup and renders the same prompt the KV cache holds.
    db.execute("""CREATE TABLE api_responses (
        id TEXT PRIMARY KEY, model TEXT NOT NULL, response TEXT NOT NULL, conversation TEXT NOT NULL,
        created REAL NOT NULL)""")


def m004_drafts(db: sqlite3.Connection) -> None:
    # what drafted a turn's answer (speculative decoding: "lookup" or the draft model's name)
    # and how much of the drafts the model confirmed
    db.execute("ALTER TABLE responses ADD COLUMN draft TEXT")
    db.execute("ALTER TABLE responses ADD COLUMN draft_tokens INTEGER")
    db.execute("ALTER TABLE responses ADD COLUMN accepted_tokens INTEGER")


def m005_conversation_titles(db: sqlite3.Connection) -> None:
    # the web page's conversations (serve/ui): a title the user gave, and the tool calls an
    # answer made (JSON, OpenAI's shape), so a resumed conversation shows and sends them again
    db.execute("ALTER TABLE conversations ADD COLUMN title TEXT")
    db.execute("ALTER TABLE responses ADD COLUMN tool_calls TEXT")


def m006_keys_and_usage(db: sqlite3.Connection) -> None:
    # a team's server (serve/http/keys.py, serve/http/usage.py): API keys by their SHA-256
    # digest, never the key; and every request's usage against its key, as the request ends
    db.execute("""CREATE TABLE api_keys (
        name TEXT PRIMARY KEY, digest TEXT NOT NULL UNIQUE, prefix TEXT NOT NULL, models TEXT NOT NULL,
        routes TEXT NOT NULL, tokens_per_minute INTEGER, requests_per_minute INTEGER, concurrency INTEGER,
        max_tokens INTEGER, expires REAL, revoked REAL, created REAL NOT NULL)""")
    db.execute("""CREATE TABLE usage (
        id INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT NOT NULL, model TEXT NOT NULL,
        prompt_tokens INTEGER NOT NULL, cached_tokens INTEGER NOT NULL, completion_tokens INTEGER NOT NULL,
        reasoning_tokens INTEGER NOT NULL, media_tokens INTEGER NOT NULL, duration_ms REAL NOT NULL,
        finish_reason TEXT NOT NULL, created REAL NOT NULL)""")
    db.execute("CREATE INDEX usage_key_time ON usage(key, created)")


def m007_audio_usage(db: sqlite3.Connection) -> None:
    # speech to text is metered by the audio heard (serve/front/audio_route.py), in milliseconds
    db.execute("ALTER TABLE usage ADD COLUMN audio_ms INTEGER NOT NULL DEFAULT 0")


def m008_usage_request(db: sqlite3.Connection) -> None:
    # the server's id of the request a row meters (its journal's id, X-Request-Id): usage and
    # `tallow logs` agree request by request
    db.execute("ALTER TABLE usage ADD COLUMN request TEXT")


MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [m001_initial, m002_reasoning, m003_api_responses,
                                                          m004_drafts, m005_conversation_titles, m006_keys_and_usage,
                                                          m007_audio_usage, m008_usage_request]


def migrate(db: sqlite3.Connection) -> list[str]:
    """Apply the migrations not yet recorded; return the names applied."""
    db.execute("CREATE TABLE IF NOT EXISTS _migrations (name TEXT PRIMARY KEY, applied REAL NOT NULL)")
    done = {row[0] for row in db.execute("SELECT name FROM _migrations")}
    applied = []
    for fn in MIGRATIONS:
        if fn.__name__ not in done:
            with db:
                fn(db)
                db.execute("INSERT INTO _migrations VALUES (?, ?)", (fn.__name__, time.time()))
            applied.append(fn.__name__)
    return applied


@dataclass
class Turn:
    """A turn to record: what was asked and answered, and what it cost."""
    conversation_id: str
    model: str
    system: str | None
    prompt: str
    response: str
    reasoning: str | None
    finish_reason: str | None
    usage: dict[str, Any]  # prompt_tokens, cached_tokens, completion_tokens, reasoning_tokens, draft...
    timings: dict[str, Any]
    tool_calls: list[dict[str, Any]] | None = None


@dataclass
class LoggedTurn(Turn):
    """A recorded turn: its row id and when it was written; `usage` also holds "draft"."""
    id: int = 0
    created: float = 0.0


class History:
    def __init__(self, path: Path | str) -> None:
        self.path = path
        if path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        # a short timeout: a locked log must not hold up an answer
        self.db = sqlite3.connect(str(path), timeout=2.0)
        migrate(self.db)

    @staticmethod
    def new_conversation_id() -> str:
        return uuid.uuid4().hex[:12]

    def log(self, conversation_id: str, model: str, system: str | None, prompt: str, final: FinalEvent,
            tool_calls: list[dict[str, Any]] | None = None) -> int:
        """A turn answered by `final`; `tool_calls`: the calls run on the way to it (--mcp)."""
        u = final.usage
        usage = {"prompt_tokens": u.prompt_tokens, "cached_tokens": u.cached_tokens,
                 "completion_tokens": u.completion_tokens, "reasoning_tokens": u.reasoning_tokens, "draft": u.draft,
                 "draft_tokens": u.draft_tokens, "accepted_tokens": u.accepted_tokens}
        return self.log_turn(Turn(conversation_id, model, system, prompt, final.text, final.reasoning or None,
                                  final.finish_reason, usage, final.timings.summary(), tool_calls or None))

    def log_turn(self, turn: Turn, replace_from: int | None = None) -> int:
        """Record a turn; with `replace_from`, the conversation's turns from that index on (0
        the first) are deleted first, in the same transaction (an edited or regenerated turn)."""
        u = turn.usage
        with self.db:
            self.db.execute("INSERT OR IGNORE INTO conversations (id, model, created) VALUES (?, ?, ?)",
                            (turn.conversation_id, turn.model, time.time()))
            if replace_from is not None:
                self.db.execute("""DELETE FROM responses WHERE id IN (SELECT id FROM responses
                                   WHERE conversation_id = ? ORDER BY id LIMIT -1 OFFSET ?)""",
                                (turn.conversation_id, replace_from))
            cur = self.db.execute(
                """INSERT INTO responses (conversation_id, model, system, prompt, response, finish_reason,
                   prompt_tokens, cached_tokens, completion_tokens, timings, created, reasoning, reasoning_tokens,
                   draft, draft_tokens, accepted_tokens, tool_calls)
                   VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
                (turn.conversation_id, turn.model, turn.system, turn.prompt, turn.response, turn.finish_reason,
                 u.get("prompt_tokens"), u.get("cached_tokens"), u.get("completion_tokens"),
                 json.dumps(turn.timings), time.time(), turn.reasoning, u.get("reasoning_tokens"), u.get("draft"),
                 u.get("draft_tokens"), u.get("accepted_tokens"),
                 json.dumps(turn.tool_calls) if turn.tool_calls else None),
            )
            assert cur.lastrowid is not None  # an INSERT just ran
        return cur.lastrowid

    def turns(self, limit: int | None = None, query: str | None = None, conversation: str | None = None) -> list[LoggedTurn]:
        """Newest first."""
        where: list[str] = []
        args: list[object] = []
        if query:
            where.append("(prompt LIKE ? OR response LIKE ? OR system LIKE ?)")
            args += [f"%{query}%"] * 3
        if conversation:
            where.append("conversation_id = ?")
            args.append(conversation)
        sql = "SELECT * FROM responses" + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY id DESC"
        if limit:
            sql += " LIMIT ?"
            args.append(limit)
        self.db.row_factory = sqlite3.Row
        rows = self.db.execute(sql, args).fetchall()
        return [LoggedTurn(r["conversation_id"], r["model"], r["system"], r["prompt"], r["response"],
                           r["reasoning"], r["finish_reason"],
                           {"prompt_tokens": r["prompt_tokens"], "cached_tokens": r["cached_tokens"],
                            "completion_tokens": r["completion_tokens"], "reasoning_tokens": r["reasoning_tokens"],
                            "draft": r["draft"], "draft_tokens": r["draft_tokens"],
                            "accepted_tokens": r["accepted_tokens"]},
                           json.loads(r["timings"] or "{}"),
                           json.loads(r["tool_calls"]) if r["tool_calls"] else None,
                           id=r["id"], created=r["created"]) for r in rows]

    def latest_conversation(self) -> str | None:
        row = self.db.execute("SELECT conversation_id FROM responses ORDER BY id DESC LIMIT 1").fetchone()
        return row[0] if row else None

    def messages(self, conversation: str) -> tuple[str | None, list[dict[str, str]], str | None]:
        """(system, messages, model) of a logged conversation, oldest first."""
        turns = list(reversed(self.turns(conversation=conversation)))
        msgs: list[dict[str, str]] = []
        for t in turns:
            msgs += [{"role": "user", "content": t.prompt}, {"role": "assistant", "content": t.response}]
        system = turns[-1].system if turns else None
        return system, msgs, (turns[-1].model if turns else None)

    # -- conversations, as the web page lists them ---------------------------------------------
    def conversations(self, limit: int = 200) -> list[dict[str, Any]]:
        """Newest activity first: id, title (the user's, else the first prompt), model, turns, updated."""
        rows = self.db.execute(
            """SELECT c.id, c.title, c.model, c.created, COUNT(r.id), MAX(r.created),
                      (SELECT prompt FROM responses WHERE conversation_id = c.id ORDER BY id LIMIT 1)
               FROM conversations c JOIN responses r ON r.conversation_id = c.id
               GROUP BY c.id ORDER BY MAX(r.id) DESC LIMIT ?""", (limit,)).fetchall()
        return [{"id": cid, "title": title or (first or "")[:80], "model": model, "created": created, "turns": n,
                 "updated": updated, "named": title is not None}
                for cid, title, model, created, n, updated, first in rows]

    def title(self, conversation: str) -> str | None:
        row = self.db.execute("SELECT title FROM conversations WHERE id = ?", (conversation,)).fetchone()
        return row[0] if row else None

    def rename(self, conversation: str, title: str) -> bool:
        with self.db:
            return self.db.execute("UPDATE conversations SET title = ? WHERE id = ?", (title, conversation)).rowcount > 0

    def delete_conversation(self, conversation: str) -> bool:
        with self.db:
            self.db.execute("DELETE FROM responses WHERE conversation_id = ?", (conversation,))
            return self.db.execute("DELETE FROM conversations WHERE id = ?", (conversation,)).rowcount > 0

    # -- stored Responses API objects ---------------------------------------------------------
    def store_response(self, response_id: str, model: str, response: dict[str, Any],
                       conversation: list[dict[str, Any]]) -> None:
        with self.db:
            self.db.execute("INSERT OR REPLACE INTO api_responses VALUES (?, ?, ?, ?, ?)",
                            (response_id, model, json.dumps(response, ensure_ascii=False),
                             json.dumps(stored(conversation), ensure_ascii=False), time.time()))

    def stored_response(self, response_id: str) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
        """(the response object, its conversation as messages), or None."""
        row = self.db.execute("SELECT response, conversation FROM api_responses WHERE id = ?",
                              (response_id,)).fetchone()
        return (json.loads(row[0]), restored(json.loads(row[1]))) if row else None

    def delete_response(self, response_id: str) -> bool:
        with self.db:
            return self.db.execute("DELETE FROM api_responses WHERE id = ?", (response_id,)).rowcount > 0

    def close(self) -> None:
        self.db.close()
