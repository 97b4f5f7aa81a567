"""The `mcpServers` configuration: a JSON file as Claude Desktop and Cursor write it, each
server a command to start (stdio) or a URL (streamable HTTP). Every mistake is one line
naming the server and the key."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from tallow.common.errors import TallowError

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,40}$")
# The limits of a session with the servers, declared here (a light module) so that the CLI's
# flag defaults derive from them without importing the SDK's event loop at start-up.
START_S = 30.0  # seconds a server may take to start and list its tools
CALL_S = 60.0  # seconds a tool call may take before it is an error the model reads
MAX_STEPS = 8  # tool calls made before the model must answer
STDIO, HTTP = ("stdio",), ("http", "streamable-http", "streamableHttp")


@dataclass(frozen=True)
class ServerSpec:
    name: str
    command: str | None = None  # stdio: the program, started with args in cwd, env added to the environment
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None  # streamable HTTP
    headers: dict[str, str] = field(default_factory=dict)


def read_config(path: Path) -> list[ServerSpec]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise TallowError(f"cannot read the MCP configuration {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise TallowError(f"the MCP configuration {path} is not JSON: {exc}") from None
    servers = data.get("mcpServers") if isinstance(data, dict) else None
    if not isinstance(servers, dict) or not servers:
        raise TallowError(f"{path} has no mcpServers", 'give {"mcpServers": {"NAME": {"command": ..., "args": [...]}}}')
    return [_server(name, spec, path) for name, spec in servers.items()
            if not (isinstance(spec, dict) and spec.get("disabled") is True)]


def _server(name: str, spec: object, path: Path) -> ServerSpec:
    where = f"{path}: mcpServers.{name}"
    if not _NAME.match(name):
        raise TallowError(f"{path}: the server name {name!r} is not 1 to 40 letters, digits, '_' or '-'")
    if not isinstance(spec, dict):
        raise TallowError(f"{where} must be an object")
    kind = spec.get("type") or ("http" if "url" in spec else "stdio")
    known = {"type", "command", "args", "env", "cwd", "url", "headers", "disabled"}
    if kind not in STDIO + HTTP or set(spec) - known:
        what = f"the type {kind!r}" if kind not in STDIO + HTTP else f"the key {sorted(set(spec) - known)[0]!r}"
        raise TallowError(f"{where}: {what} is not supported", "a server is a command (stdio) or a url (streamable HTTP)")
    if kind in HTTP:
        url = spec.get("url")
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise TallowError(f"{where}.url must be an http(s) URL")
        return ServerSpec(name, url=url, headers=_strings(spec.get("headers"), f"{where}.headers"))
    command, args = spec.get("command"), spec.get("args", [])
    if not isinstance(command, str) or not command:
        raise TallowError(f"{where}.command must name the program that runs the server")
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise TallowError(f"{where}.args must be a list of strings")
    cwd = spec.get("cwd")
    if cwd is not None and not isinstance(cwd, str):
        raise TallowError(f"{where}.cwd must be a path")
    return ServerSpec(name, command=command, args=tuple(args), env=_strings(spec.get("env"), f"{where}.env"), cwd=cwd)


def _strings(value: object, where: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise TallowError(f"{where} must be an object of strings")
    return dict(value)
