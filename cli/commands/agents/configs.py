"""Each agent's configuration as the agent itself reads it: the file, its format, and the API
it should speak to tallow (Messages for Claude Code, Responses for Codex, chat completions for
the rest). `write` returns the file's new text from its old one (None: there was none), so
that what the user had is kept beside it and merged with where the format allows."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tallow.common.errors import TallowError

NO_KEY = "tallow"  # what a client that insists on a key sends to a server that takes none


@dataclass(frozen=True)
class Agent:
    name: str
    title: str
    path: Callable[[Path], Path]  # HOME -> the file it reads
    write: Callable[[str | None, str, str, str], str]  # (old text, base URL, model, key) -> new text
    command: str  # the program to run
    install: str  # how to install it


def _json(old: str | None, where: str) -> dict:
    if not old or not old.strip():
        return {}
    try:
        data = json.loads(old)
    except ValueError as exc:
        raise TallowError(f"{where} is not JSON ({exc}); fix it or move it away first") from None
    if not isinstance(data, dict):
        raise TallowError(f"{where} does not hold a JSON object")
    return data


def claude(old: str | None, base: str, model: str, key: str) -> str:
    """~/.claude/settings.json: its `env` points Claude Code at Anthropic's Messages API here."""
    data = _json(old, "~/.claude/settings.json")
    env: dict = data["env"] if isinstance(data.get("env"), dict) else {}
    data["env"] = {**env, "ANTHROPIC_BASE_URL": base, "ANTHROPIC_AUTH_TOKEN": key, "ANTHROPIC_MODEL": model,
                   "ANTHROPIC_SMALL_FAST_MODEL": model, "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
    return json.dumps(data, indent=2) + "\n"


def opencode(old: str | None, base: str, model: str, key: str) -> str:
    """~/.config/opencode/opencode.json: a provider of OpenAI's chat API, and it as the model."""
    data = _json(old, "~/.config/opencode/opencode.json")
    providers: dict = data["provider"] if isinstance(data.get("provider"), dict) else {}
    providers["tallow"] = {"npm": "@ai-sdk/openai-compatible", "name": "tallow",
                           "options": {"baseURL": base + "/v1", "apiKey": key}, "models": {model: {"name": model}}}
    data.setdefault("$schema", "https://opencode.ai/config.json")
    data["provider"], data["model"] = providers, f"tallow/{model}"
    return json.dumps(data, indent=2) + "\n"


def codex(old: str | None, base: str, model: str, key: str) -> str:
    """~/.codex/config.toml: a [model_providers.tallow] speaking the Responses API (the only
    wire API Codex takes), chosen at the top; the rest of the file is kept."""
    text = old or ""
    head, _, rest = text.partition("\n[") if not text.startswith("[") else ("", "", text[1:])
    head = "\n".join(line for line in head.splitlines() if not re.match(r"\s*(model|model_provider)\s*=", line))
    tables = ("[" + rest) if rest else ""
    tables = re.sub(r"(?ms)^\[model_providers\.tallow\]\n.*?(?=^\[|\Z)", "", tables)
    auth = '\nenv_key = "TALLOW_API_KEY"' if key != NO_KEY else ""  # launch sets it when it runs codex
    ours = (f'model = {json.dumps(model)}\nmodel_provider = "tallow"\n' + (head.strip() + "\n" if head.strip() else "")
            + ("\n" + tables.strip() + "\n" if tables.strip() else "")
            + f'\n[model_providers.tallow]\nname = "tallow"\nbase_url = {json.dumps(base + "/v1")}\nwire_api = "responses"{auth}\n')
    try:
        import tomllib
    except ImportError:  # Python 3.10: no reader to check with
        return ours
    try:
        if tomllib.loads(ours).get("model") != model:
            raise ValueError("the model did not land at the top")
    except ValueError as exc:
        raise TallowError(f"~/.codex/config.toml could not be merged ({exc}); move it away, or --print and edit it") from None
    return ours


def aider(old: str | None, base: str, model: str, key: str) -> str:
    """~/.aider.conf.yml: its flat keys for an OpenAI-compatible API, the others kept."""
    ours = {"openai-api-base": base + "/v1", "openai-api-key": key, "model": f"openai/{model}"}
    kept = [line for line in (old or "").splitlines() if line.split(":", 1)[0].strip() not in ours]
    return "\n".join([*kept, *(f"{k}: {json.dumps(v)}" for k, v in ours.items())]) + "\n"


def continue_(old: str | None, base: str, model: str, key: str) -> str:
    """~/.continue/config.yaml: an assistant whose model is tallow's (the whole file: a YAML
    of nested lists is not merged line by line; the old one is kept beside it)."""
    return (f"name: tallow\nversion: 1.0.0\nschema: v1\nmodels:\n  - name: {json.dumps(model)}\n"
            f"    provider: openai\n    model: {json.dumps(model)}\n    apiBase: {json.dumps(base + '/v1')}\n"
            f"    apiKey: {json.dumps(key)}\n    roles: [chat, edit, apply, autocomplete]\n")


AGENTS = {a.name: a for a in (
    Agent("claude", "Claude Code", lambda h: h / ".claude" / "settings.json", claude, "claude",
          "npm install -g @anthropic-ai/claude-code"),
    Agent("codex", "Codex CLI", lambda h: h / ".codex" / "config.toml", codex, "codex", "npm install -g @openai/codex"),
    Agent("opencode", "opencode", lambda h: h / ".config" / "opencode" / "opencode.json", opencode, "opencode",
          "npm install -g opencode-ai"),
    Agent("aider", "Aider", lambda h: h / ".aider.conf.yml", aider, "aider", "pip install aider-chat"),
    Agent("continue", "Continue", lambda h: h / ".continue" / "config.yaml", continue_, "",
          "install the Continue extension in VS Code or JetBrains"),
)}
