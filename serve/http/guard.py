"""The checks every request passes before any route runs: the Host header (DNS rebinding),
the API key (Bearer or x-api-key; /health and /ready need none, for probes), the body
size, and a draining replica's refusal; and CORS headers, only for origins named with
--cors."""

from __future__ import annotations

import hmac

from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware

from tallow.common.net import is_loopback
from tallow.serve.config import ServerConfig
from tallow.serve.http.body import too_large
from tallow.serve.http.errors import error_response, send_error
from tallow.serve.http.key_check import KeyCheck
from tallow.serve.http.replica import PROBES
from tallow.wire.apis import body_limit
from tallow.wire.fields import APIError

LOOPBACK = ("127.0.0.1", "localhost", "::1")
OPEN_PATHS = ("/health", "/ready")  # no API key: load balancers and probes cannot send one
# ... nor can a browser loading the chat page, whose files hold nothing secret; the page
# asks for the key and sends it with every API call (serve/ui/page.py)
PAGE_PATHS, PAGE_PREFIX = ("/",), "/ui/assets/"


def needs_key(method: str, path: str) -> bool:
    if method == "OPTIONS" or path in OPEN_PATHS:
        return False
    return not (method in ("GET", "HEAD") and (path in PAGE_PATHS or path.startswith(PAGE_PREFIX)))


def host_name(header: str) -> str:
    """The name in a Host header, without the port ('[::1]:8080' -> '::1')."""
    if header.startswith("["):
        return header[1:].split("]", 1)[0]
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def given_key(headers: dict[str, str]) -> str:
    """The key a request gives: OpenAI's and Ollama's clients as a Bearer token, Anthropic's as x-api-key."""
    auth = headers.get("authorization", "")
    given = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
    return given or headers.get("x-api-key", "").strip()


class Guard:
    """ASGI middleware: Host check, API key (or, with `keys`, each key's rights and limits)
    and body size, before any route runs."""

    def __init__(self, app, cfg: ServerConfig, replica=None, keys: KeyCheck | None = None) -> None:
        self.app, self.cfg, self.keys = app, cfg, keys
        self.replica = replica  # serve/http/replica.py: the front counts requests and refuses them while draining
        self.check_host = is_loopback(cfg.host)
        self.key = cfg.api_key.encode() if cfg.api_key else None
        self.per_client: dict[str, int] = {}  # requests open, by client address (serve --max-per-client)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if self.check_host and host_name(headers.get("host", "")).lower() not in LOOPBACK:
            err = APIError("this server answers only to a loopback Host header", 403, code="host_not_allowed")
            return await send_error(scope, receive, send, err)
        path = scope["path"]
        address = (scope.get("client") or ("",))[0]
        if self.cfg.max_per_client and self.per_client.get(address, 0) >= self.cfg.max_per_client:
            err = APIError(f"{address} has {self.cfg.max_per_client} requests open here (serve --max-per-client)", 429,
                           code="rate_limit_exceeded", kind="rate_limit_error")
            return await error_response(path, err, {"Retry-After": "1"})(scope, receive, send)
        self.per_client[address] = self.per_client.get(address, 0) + 1
        try:
            return await self.checked(scope, receive, send, headers)
        finally:
            if (left := self.per_client[address] - 1) > 0:
                self.per_client[address] = left
            else:
                del self.per_client[address]

    async def checked(self, scope, receive, send, headers: dict[str, str]) -> None:
        """Past the Host check and the per-client cap: the key."""
        method, path = scope["method"], scope["path"]
        if self.keys is not None and needs_key(method, path):
            return await self.keyed(scope, receive, send, headers)
        if self.key is not None and needs_key(method, path) and not hmac.compare_digest(
                given_key(headers).encode(), self.key):
            err = APIError("a valid API key is required (Authorization: Bearer KEY, or x-api-key: KEY)", 401,
                           code="invalid_api_key", kind="authentication_error")
            return await send_error(scope, receive, send, err)
        return await self.admitted(scope, receive, send, headers)

    async def keyed(self, scope, receive, send, headers: dict[str, str]) -> None:
        """`tallow serve --auth keys`: the key's rights and limits; the key rides in the scope's
        state for the routes (the proxy checks its models, and its standing mid-stream)."""
        assert self.keys is not None
        method, path = scope["method"], scope["path"]
        try:
            key = self.keys.identify(given_key(headers), method, path)
        except APIError as err:
            return await send_error(scope, receive, send, err)
        refused = self.keys.admit(key, method, path)
        if refused is not None:
            return await error_response(path, refused[0], refused[1])(scope, receive, send)
        scope.setdefault("state", {})["tallow.key"] = key
        try:
            return await self.admitted(scope, receive, send, headers)
        finally:
            self.keys.done(key)

    async def admitted(self, scope, receive, send, headers: dict[str, str]) -> None:
        """Past the key: the body's size, and a draining replica's refusal."""
        length, limit = headers.get("content-length"), body_limit(scope["path"], self.cfg.max_body)
        if length is not None and (not length.isdigit() or int(length) > limit):
            return await send_error(scope, receive, send, too_large(limit))
        if self.replica is None or scope["path"] in PROBES:
            return await self.app(scope, receive, send)
        if not self.replica.admit():
            err = APIError("this server is shutting down and takes no new requests", 503, code="draining",
                           kind="server_error")
            return await error_response(scope["path"], err, {"Retry-After": "1"})(scope, receive, send)
        try:
            return await self.app(scope, receive, send)
        finally:
            self.replica.done()


def cors(cfg: ServerConfig) -> list[Middleware]:
    """CORS headers, only for the origins named with --cors. A preflight from an allowed origin
    is allowed the headers it asks for: the OpenAI and Anthropic JavaScript SDKs send their own
    (x-stainless-*, anthropic-beta, ...), and a fixed list failed their preflight. The origin
    is the guard; the key check still reads Authorization / x-api-key on the request itself."""
    if not cfg.cors:
        return []
    return [Middleware(CORSMiddleware, allow_origins=list(cfg.cors), allow_methods=["GET", "POST", "DELETE"],
                       allow_headers=["*"])]
