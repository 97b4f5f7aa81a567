"""`tallow serve --auth keys`: each request's key checked against what it may do and what it
has used, before any route runs (the guard calls `KeyCheck.admit`).

Route groups: `generate` (the chat, completion, Responses, Messages and Ollama generate
routes, and the chat page's conversations), `embed` (embeddings and rerank), `admin` (pull,
delete, create, copy, adapters' scales, /metrics, the chat page's tool calls; an Ollama unload is checked by the proxy,
which reads the body). Reading what the server offers (models, tags, ps, show, version) takes
any valid key. Limits: requests a minute and tokens a minute are token buckets refilled
continuously; tokens are charged as each request's usage row arrives (serve/http/usage.py),
so a request is admitted while its key's token bucket is above empty and its own tokens are
charged after. Concurrency counts requests in flight. Over a limit: 429 with Retry-After.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from tallow.serve.http.keys import Key, KeyRing
from tallow.serve.http.prometheus import counter_family
from tallow.serve.http.usage import COUNTS, Row, UsageTail
from tallow.wire.apis import ADMIN, GENERATE, READ, kind_of
from tallow.wire.fields import APIError

CATCH_UP = 0.2  # seconds between reads of the usage rows that arrived
PAGE_TOOL_CALL = "/ui/api/tools/call"  # the chat page's route that runs an MCP tool (serve/ui/tools.py)


def route_group(method: str, path: str) -> str | None:
    """The group a route belongs to (None: reading what the server offers): each API's routes
    by their records (wire/apis.py); tallow's own: /metrics and setting adapters' scales are
    admin, the chat page's conversations generate, and running a tool for the page (which runs
    with the server's rights on its machine) admin."""
    if path in ("/metrics", PAGE_TOOL_CALL) or (path == "/lora-adapters" and method == "POST"):
        return ADMIN
    if path.startswith("/ui/api/"):
        return GENERATE
    kind = kind_of(path)
    return None if kind in (None, READ) else kind


class Bucket:
    """A token bucket of `per_minute`, full to start, refilled continuously."""

    def __init__(self, per_minute: int) -> None:
        self.per_minute, self.level, self.at = per_minute, float(per_minute), time.monotonic()

    def refill(self) -> float:
        now = time.monotonic()
        self.level = min(self.per_minute, self.level + (now - self.at) * self.per_minute / 60)
        self.at = now
        return self.level

    def wait_for(self, n: float) -> float:
        """Seconds until the bucket holds `n`; 0 when it does now."""
        have = self.refill()
        return 0.0 if have >= n else (n - have) * 60 / self.per_minute + 0.001


@dataclass
class Account:
    """One key's live state in this server: its buckets, requests in flight, and counters."""
    requests: Bucket | None = None
    tokens: Bucket | None = None
    in_flight: int = 0
    by_model: dict[str, dict[str, int]] = field(default_factory=dict)  # /metrics: counts by model


def too_many(what: str, wait: float) -> tuple[APIError, dict[str, str]]:
    err = APIError(f"rate limit: {what}; try again in {wait:.1f} s", 429, code="rate_limit_exceeded",
                   kind="rate_limit_error")
    return err, {"Retry-After": str(max(1, math.ceil(wait)))}


class KeyCheck:
    """The keys, the accounts and the usage rows of one server."""

    def __init__(self, path: str) -> None:
        self.ring = KeyRing(path)
        self.tail = UsageTail(path)
        self.accounts: dict[str, Account] = {}
        self.caught_up = 0.0

    def account(self, key: Key) -> Account:
        acct = self.accounts.setdefault(key.name, Account())
        lim = key.limits
        if (acct.requests.per_minute if acct.requests else None) != lim.requests_per_minute:
            acct.requests = Bucket(lim.requests_per_minute) if lim.requests_per_minute else None
        if (acct.tokens.per_minute if acct.tokens else None) != lim.tokens_per_minute:
            acct.tokens = Bucket(lim.tokens_per_minute) if lim.tokens_per_minute else None
        return acct

    def catch_up(self) -> None:
        """Charge the usage rows written since the last look (at most every CATCH_UP s)."""
        if time.monotonic() - self.caught_up < CATCH_UP:
            return
        self.caught_up = time.monotonic()
        for row in self.tail.new_rows():
            self.charge(row)

    def charge(self, row: Row) -> None:
        acct = self.accounts.setdefault(row.key, Account())
        if acct.tokens is not None:
            acct.tokens.refill()
            acct.tokens.level -= row.prompt_tokens + row.completion_tokens
        counts = acct.by_model.setdefault(row.model, {"requests": 0, **{c: 0 for c in COUNTS}})
        counts["requests"] += 1
        for c in COUNTS:
            counts[c] += getattr(row, c)

    def identify(self, given: str, method: str, path: str) -> Key:
        """The key a request gave, if it may use this route now; else the 401 or 403 to send."""
        key = self.ring.lookup(given) if given else None
        if key is None:
            raise APIError("a valid API key is required (Authorization: Bearer KEY, or x-api-key: KEY)", 401,
                           code="invalid_api_key", kind="authentication_error")
        refusal = key.refusal()
        if refusal:
            raise APIError(refusal, 401, code="invalid_api_key", kind="authentication_error")
        group = route_group(method, path)
        if group is not None and group not in key.routes:
            raise APIError(f"the API key '{key.name}' may not use {group} routes ({path})", 403,
                           code="permission_denied", kind="permission_error")
        return key

    def admit(self, key: Key, method: str, path: str) -> tuple[APIError, dict[str, str]] | None:
        """Take a request of `key` in (None), or the 429 and its headers; `done` must follow an admission."""
        if route_group(method, path) not in ("generate", "embed") or path.startswith("/ui/api/"):
            self.account(key).in_flight += 1
            return None
        self.catch_up()
        acct, lim = self.account(key), key.limits
        if lim.concurrency is not None and acct.in_flight >= lim.concurrency:
            return too_many(f"the key '{key.name}' has {acct.in_flight} requests in flight (its limit)", 1.0)
        if acct.tokens is not None and (wait := acct.tokens.wait_for(1)) > 0:
            return too_many(f"the key '{key.name}' used its {lim.tokens_per_minute} tokens a minute", wait)
        if acct.requests is not None:
            if (wait := acct.requests.wait_for(1)) > 0:
                return too_many(f"the key '{key.name}' made its {lim.requests_per_minute} requests a minute", wait)
            acct.requests.level -= 1
        acct.in_flight += 1
        return None

    def done(self, key: Key) -> None:
        self.accounts[key.name].in_flight -= 1

    def still_valid(self, key: Key) -> str | None:
        """Why a key admitted earlier may no longer be used (revoked or expired meanwhile), or None."""
        now = self.ring.current(key.name)
        return now.refusal() if now is not None else f"the API key '{key.name}' was removed"

    def metrics(self) -> list[str]:
        """Per-key counters for /metrics: the key's name, never the key."""
        self.catch_up()
        lines: list[str] = []
        for metric, what, name in (("tallow_key_requests_total", "Requests finished", "requests"),
                                   ("tallow_key_prompt_tokens_total", "Prompt tokens", "prompt_tokens"),
                                   ("tallow_key_cached_tokens_total", "Prompt tokens from the KV cache", "cached_tokens"),
                                   ("tallow_key_completion_tokens_total", "Tokens generated", "completion_tokens")):
            samples = [({"key": key, "model": model}, counts[name]) for key, acct in sorted(self.accounts.items())
                       for model, counts in sorted(acct.by_model.items())]
            lines += counter_family(metric, f"{what}, by API key and model", samples)
        return lines
