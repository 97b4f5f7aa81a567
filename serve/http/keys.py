"""API keys for a team's server (`tallow keys`, `tallow serve --auth keys`).

A key is `tallow-` and 43 random URL-safe characters (256 bits), shown once when it is made;
the database (tallow's history database, table `api_keys`) keeps its SHA-256 digest, a short
prefix to recognise it by, and what it may do: which models (shell-style patterns), which
routes (generate, embed, admin), its limits, and when it expires or was revoked. A digest
is enough: the key is random, so there is nothing to guess from it. The server looks keys up
by digest and rereads a key's row at most once a second, so a `tallow keys revoke` in
another process takes effect within a second, on streams already running too.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
import hashlib
import json
import re
import secrets
import sqlite3
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from tallow.common.errors import TallowError
from tallow.runtime.history import migrate

ROUTES = ("generate", "embed", "admin")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
PREFIX = "tallow-"
FRESH = 1.0  # seconds a key's row is trusted before it is read again


class KeyProblem(TallowError):
    """A key command that cannot be done (a name taken or unknown, a bad limit)."""


@dataclass(frozen=True)
class Limits:
    """What a key may use; None: no limit of that kind."""
    tokens_per_minute: int | None = None
    requests_per_minute: int | None = None
    concurrency: int | None = None
    max_tokens: int | None = None


@dataclass(frozen=True)
class Key:
    name: str
    prefix: str  # the key's first characters, to recognise it by (never enough to use it)
    models: tuple[str, ...] = ()  # shell patterns of model names; () = every model
    routes: tuple[str, ...] = ("generate", "embed")
    limits: Limits = field(default_factory=Limits)
    expires: float | None = None
    revoked: float | None = None
    created: float = 0.0

    def refusal(self, now: float | None = None) -> str | None:
        """Why this key cannot be used now, or None."""
        now = time.time() if now is None else now
        if self.revoked is not None:
            return f"the API key '{self.name}' was revoked"
        if self.expires is not None and now >= self.expires:
            return f"the API key '{self.name}' expired on {show_time(self.expires)}"
        return None

    def allows_model(self, model: str) -> bool:
        return not self.models or any(fnmatch.fnmatchcase(model, p) for p in self.models)

    def public(self) -> dict[str, Any]:
        out = asdict(self)
        out["limits"] = {k: v for k, v in asdict(self.limits).items() if v is not None}
        for when in ("expires", "revoked", "created"):
            out[when] = show_time(out[when]) if out[when] is not None else None
        return out


def show_time(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def parse_date(text: str) -> float:
    """A date (2027-01-31, midnight UTC) or an ISO time (with an offset, else UTC) as a timestamp."""
    try:
        when = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise KeyProblem(f"'{text}' is not a date", "give YYYY-MM-DD or an ISO time such as 2027-01-31T18:00") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    return when.timestamp()


def parse_routes(text: str) -> tuple[str, ...]:
    wanted = tuple(dict.fromkeys(r.strip() for r in text.split(",") if r.strip()))
    bad = [r for r in wanted if r not in ROUTES]
    if bad or not wanted:
        raise KeyProblem(f"unknown route group {', '.join(bad) or '(none)'}", f"choose from {', '.join(ROUTES)}")
    return wanted


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def _row_key(row: sqlite3.Row) -> Key:
    limits = Limits(row["tokens_per_minute"], row["requests_per_minute"], row["concurrency"], row["max_tokens"])
    return Key(row["name"], row["prefix"], tuple(json.loads(row["models"])), tuple(json.loads(row["routes"])), limits,
               row["expires"], row["revoked"], row["created"])


class KeyStore:
    """The keys in the database at `path`: made, listed, changed, revoked, looked up."""

    def __init__(self, path: Path | str) -> None:
        if str(path) != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(str(path), timeout=5.0, check_same_thread=False)
        self.db.row_factory = sqlite3.Row
        migrate(self.db)

    def create(self, name: str, models: tuple[str, ...] = (), routes: tuple[str, ...] = ("generate", "embed"),
               limits: Limits = Limits(), expires: float | None = None) -> tuple[str, Key]:
        """(the plain key, to be shown once, and what was stored)."""
        if not NAME.fullmatch(name):
            raise KeyProblem(f"'{name}' is not a key name", "1 to 64 letters, digits, '.', '_' or '-', first a letter or digit")
        check_limits(limits)
        plain = PREFIX + secrets.token_urlsafe(32)
        key = Key(name, plain[:len(PREFIX) + 4], tuple(models), tuple(routes), limits, expires, None, time.time())
        try:
            with self.db:
                self.db.execute("INSERT INTO api_keys VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                                (name, digest(plain), key.prefix, json.dumps(key.models), json.dumps(key.routes),
                                 limits.tokens_per_minute, limits.requests_per_minute, limits.concurrency,
                                 limits.max_tokens, expires, None, key.created))
        except sqlite3.IntegrityError:
            raise KeyProblem(f"a key named '{name}' exists", "pick another name, or tallow keys update it") from None
        return plain, key

    def all(self) -> list[Key]:
        return [_row_key(r) for r in self.db.execute("SELECT * FROM api_keys ORDER BY created")]

    def get(self, name: str) -> Key:
        key = self.by("name", name)
        if key is None:
            raise KeyProblem(f"no key named '{name}'", "tallow keys list shows them")
        return key

    def by(self, column: str, value: str) -> Key | None:
        """The key whose `column` ("name" or "digest") is `value`."""
        assert column in ("name", "digest")
        row = self.db.execute(f"SELECT * FROM api_keys WHERE {column} = ?", (value,)).fetchone()
        return _row_key(row) if row is not None else None

    def revoke(self, name: str) -> Key:
        key = self.get(name)
        if key.revoked is None:
            with self.db:
                self.db.execute("UPDATE api_keys SET revoked = ? WHERE name = ?", (time.time(), name))
        return self.get(name)

    def update(self, name: str, models: tuple[str, ...] | None = None, routes: tuple[str, ...] | None = None,
               limits: dict[str, int | None] | None = None, expires: float | None | str = "keep") -> Key:
        """Change what is given (a limit of 0 removes that limit; expires None: never)."""
        key = self.get(name)
        new = replace(key, models=key.models if models is None else tuple(models),
                      routes=key.routes if routes is None else tuple(routes),
                      limits=replace(key.limits, **{k: (v or None) for k, v in (limits or {}).items()}),
                      expires=key.expires if expires == "keep" else expires)  # type: ignore[arg-type]
        check_limits(new.limits)
        with self.db:
            self.db.execute("""UPDATE api_keys SET models = ?, routes = ?, tokens_per_minute = ?,
                               requests_per_minute = ?, concurrency = ?, max_tokens = ?, expires = ? WHERE name = ?""",
                            (json.dumps(new.models), json.dumps(new.routes), new.limits.tokens_per_minute,
                             new.limits.requests_per_minute, new.limits.concurrency, new.limits.max_tokens,
                             new.expires, name))
        return new


def check_limits(limits: Limits) -> None:
    for name, value in asdict(limits).items():
        if value is not None and not (isinstance(value, int) and 1 <= value <= 10**12):
            raise KeyProblem(f"{name.replace('_', '-')} must be a whole number from 1 (or 0 to remove it)")


class KeyRing:
    """The server's view of the keys: a key given with a request, found by digest, its row
    reread at most once a second (so a revocation elsewhere is seen within a second)."""

    def __init__(self, path: Path | str) -> None:
        self.store = KeyStore(path)
        self.seen: dict[str, tuple[float, Key | None]] = {}  # "digest:..." or "name:..." -> (when read, the key)

    def lookup(self, plain: str) -> Key | None:
        """The key given with a request."""
        return self.cached("digest", digest(plain))

    def current(self, name: str) -> Key | None:
        """A key found earlier, as it stands now (revoked or expired meanwhile, say)."""
        return self.cached("name", name)

    def cached(self, column: str, value: str) -> Key | None:
        now = time.monotonic()
        found = self.seen.get(column + ":" + value)
        if found is not None and now - found[0] < FRESH:
            return found[1]
        key = self.store.by(column, value)
        if len(self.seen) > 10_000:  # a flood of made-up keys must not grow this without end
            self.seen.clear()
        self.seen[column + ":" + value] = (now, key)
        return key
