"""The APIs tallow serves, one record each: its routes (the path, its methods, whether it is
served under /v1 too or only there, what it does, and which handler answers it), the field
table's surface its bodies are read by, and its error shape. The runner's router, the
embedding runner's, the front's proxy routes, the key check's route groups and the error
handlers iterate these records instead of listing paths (docs/DESIGN.md, "Request fields",
on adding an API).

Pure data: the handlers are named, and each app binds the names it implements.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from tallow.wire import anthropic_api, ollama_api
from tallow.wire.fields import APIError

# What a route does, for the key check's route groups (serve/http/key_check.py): generate and
# embed need a key's right to them, admin its admin right, read any valid key.
GENERATE, EMBED, READ, ADMIN = "generate", "embed", "read", "admin"


@dataclass(frozen=True)
class Route:
    path: str  # without /v1
    kind: str  # GENERATE | EMBED | READ | ADMIN
    handler: str  # the answering method's name: a runner's (generate), an embedder's (embed), or the front's
    methods: tuple[str, ...] = ("POST",)
    prefixes: tuple[str, ...] = ("",)  # ("/v1", ""): OpenAI's clients given a bare base URL leave /v1 out
    front: bool = False  # answered by the multi-model front itself (the store), not relayed to a runner
    max_body: int | None = None  # bytes a body may hold here, when more than the server's --max-body (an upload)

    def paths(self) -> list[str]:
        return [p + self.path for p in self.prefixes]


@dataclass(frozen=True)
class API:
    name: str
    surface: str | None  # the field table's surface (common/fields.py) its request bodies use
    routes: tuple[Route, ...]
    error: Callable[[APIError], dict[str, Any]]  # the error body in this API's shape
    owns: tuple[str, ...] = ()  # path prefixes whose errors take this shape even off its routes (a 404)


BOTH = ("/v1", "")
AUDIO_BODY = 25 * 1024 * 1024  # OpenAI's limit on an audio upload

OPENAI = API("openai", "openai", (
    Route("/chat/completions", GENERATE, "chat_completions", prefixes=BOTH),
    Route("/chat/completions/input_tokens", GENERATE, "chat_input_tokens", prefixes=BOTH),  # llama-server's
    Route("/completions", GENERATE, "completions", prefixes=("/v1",)),  # bare /completions is llama.cpp's
    Route("/embeddings", EMBED, "embeddings", prefixes=BOTH),
    Route("/models", READ, "models", ("GET",), BOTH, front=True),  # a runner lists its own model
    # speech to text: a Whisper model has no runner, the front answers (serve/front/audio_route.py)
    Route("/audio/transcriptions", GENERATE, "transcriptions", prefixes=BOTH, front=True, max_body=AUDIO_BODY),
    Route("/audio/translations", GENERATE, "translations", prefixes=BOTH, front=True, max_body=AUDIO_BODY),
), lambda err: err.body())
RESPONSES = API("responses", "responses", (
    Route("/responses", GENERATE, "responses", prefixes=BOTH),
    Route("/responses/input_tokens", GENERATE, "responses_input_tokens", prefixes=BOTH),
), lambda err: err.body())
ANTHROPIC = API("anthropic", "anthropic", (
    Route("/messages", GENERATE, "messages", prefixes=BOTH),
    Route("/messages/count_tokens", GENERATE, "count_tokens", prefixes=BOTH),
), anthropic_api.anthropic_error, owns=("/v1/messages", "/messages"))
OLLAMA = API("ollama", "ollama", (
    Route("/api/chat", GENERATE, "ollama"),
    Route("/api/generate", GENERATE, "ollama"),
    Route("/api/embed", EMBED, "ollama_embed"),
    Route("/api/embeddings", EMBED, "ollama_embed"),
    # the store, answered by the front (serve/front/front_app.py); /api/push is not offered
    Route("/api/tags", READ, "tags", ("GET",), front=True), Route("/api/ps", READ, "ps", ("GET",), front=True),
    Route("/api/version", READ, "version", ("GET",), front=True), Route("/api/show", READ, "show", front=True),
    Route("/api/pull", ADMIN, "pull", front=True), Route("/api/delete", ADMIN, "delete", ("DELETE",), front=True),
    Route("/api/create", ADMIN, "create", front=True), Route("/api/copy", ADMIN, "copy", front=True),
    Route("/api/push", ADMIN, "", front=True),
), ollama_api.ollama_error, owns=("/api/",))
LLAMACPP = API("llamacpp", "llamacpp", (
    Route("/completion", GENERATE, "completion"),
    Route("/completions", GENERATE, "bare_completions"),  # llama-server's alias (OpenAI's form: OpenAI's)
    Route("/infill", GENERATE, "completion"),
    Route("/tokenize", READ, "tokenize"), Route("/detokenize", READ, "detokenize"),
    Route("/apply-template", READ, "apply_template"),
    Route("/props", READ, "props", ("GET",)), Route("/slots", ADMIN, "slots", ("GET",)),
    Route("/rerank", EMBED, "rerank", prefixes=BOTH),
), lambda err: err.body())

APIS: tuple[API, ...] = (OPENAI, RESPONSES, ANTHROPIC, OLLAMA, LLAMACPP)
BY_PATH: dict[str, tuple[API, Route]] = {path: (api, r) for api in APIS for r in api.routes for path in r.paths()}


def api_of(path: str) -> API:
    """The API a path belongs to (its own route, else the prefix it falls under); OpenAI's
    shape for the rest (health, metrics, a path no API has)."""
    found = BY_PATH.get(path)
    if found is not None:
        return found[0]
    return next((api for api in APIS if path.startswith(api.owns)), OPENAI) if path else OPENAI


def error_body(path: str, err: APIError) -> dict[str, Any]:
    return api_of(path).error(err)


def routes(*kinds: str) -> list[tuple[str, Route]]:
    """(path, route) for every route of these kinds (all for none) that some app answers."""
    return [(path, r) for api in APIS for r in api.routes if (not kinds or r.kind in kinds) and r.handler
            for path in r.paths()]


def body_limit(path: str, default: int) -> int:
    """The most bytes a body to `path` may hold: the route's own limit where it takes uploads."""
    found = BY_PATH.get(path)
    return max(default, found[1].max_body or 0) if found is not None else default


def kind_of(path: str) -> str | None:
    """What the route at `path` does (None: no API's route; a stored response is its API's)."""
    found = BY_PATH.get(path)
    if found is not None:
        return found[1].kind
    bare = path[3:] if path.startswith("/v1/") else path
    return GENERATE if bare.startswith("/responses/") else None
