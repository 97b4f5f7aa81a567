"""docs/clients.md's recipes, each tried against a real `tallow serve` of the default model:
the Python ones (the OpenAI, Anthropic and Ollama SDKs, LangChain) run as written; for the
others (Open WebUI, Continue, Cline, Aider, Codex CLI, Claude Code) the settings are read
from the block and the requests that client makes are made with exactly those settings,
through the official library for the API it speaks. Where `tallow launch` writes the same
file, the block must say what launch writes."""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import pytest
import tomllib
import yaml
from helpers.server import Server

pytestmark = pytest.mark.slow  # a server of the default model, and eleven clients

DOC = Path(__file__).resolve().parent.parent / "docs" / "clients.md"
PLACE = "http://127.0.0.1:8080"
MODEL = "smollm2:135m"


def recipes() -> list[tuple[str, str]]:
    """(kind, body) of each block marked `<!-- recipe: KIND -->`, in the page's order."""
    found = re.findall(r"<!-- recipe: ([\w ]+) -->\n```\w*\n(.*?)\n```", DOC.read_text(encoding="utf-8"), re.S)
    return [(kind.strip(), body) for kind, body in found]


RECIPES = recipes()


@pytest.fixture(scope="module")
def server(default_home):
    s = Server(MODEL, default_home, "--parallel", "2")
    yield s
    s.close()


def test_every_client_the_page_promises_has_a_recipe():
    kinds = [k for k, _ in RECIPES]
    assert kinds.count("python") == 4 and {"env ollama", "env openai", "continue", "fields openai", "aider", "codex",
                                           "claude"} <= set(kinds)


def _openai_chat(base: str, key: str, model: str) -> str:
    import openai

    client = openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=120)
    assert model in [m.id for m in client.models.list()]
    text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Say hi."}], max_tokens=8, stream=True) if c.choices)
    return text


def _launch_writes(agent: str, key: str) -> str:
    from tallow.cli.commands.agents.configs import AGENTS

    return AGENTS[agent].write(None, PLACE, MODEL, key)


def _try(kind: str, body: str, url: str) -> str:
    """What the client configured by `body` got back from the server at `url`."""
    body = body.replace(PLACE, url)
    if kind == "python":
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(body, str(DOC), "exec"), {"__name__": "recipe"})  # noqa: S102 - the page's own example
        return out.getvalue()
    if kind == "env ollama":  # Open WebUI: the model list, then a streamed chat, over Ollama's API
        import ollama

        client = ollama.Client(host=re.search(r"OLLAMA_BASE_URL=(\S+)", body).group(1))
        assert MODEL in [m.model for m in client.list().models]
        return "".join(part.message.content for part in client.chat(
            model=MODEL, messages=[{"role": "user", "content": "Say hi."}], options={"num_predict": 8}, stream=True))
    if kind in ("env openai", "fields openai"):
        pairs = dict(re.findall(r"^([\w ]+?)[=:] ?(\S+)$", body, re.M))
        base = pairs.get("OPENAI_API_BASE_URL") or pairs["Base URL"]
        return _openai_chat(base, pairs.get("OPENAI_API_KEY") or pairs["API Key"], pairs.get("Model ID", MODEL))
    if kind == "continue":
        (model,) = yaml.safe_load(body)["models"]
        assert model["provider"] == "openai"
        return _openai_chat(model["apiBase"], model["apiKey"], model["model"])
    if kind == "aider":
        conf = yaml.safe_load(body)
        return _openai_chat(conf["openai-api-base"], conf["openai-api-key"], conf["model"].removeprefix("openai/"))
    if kind == "codex":
        import openai

        conf = tomllib.loads(body)
        provider = conf["model_providers"][conf["model_provider"]]
        assert provider["wire_api"] == "responses"
        client = openai.OpenAI(base_url=provider["base_url"], api_key="codex", max_retries=0, timeout=120)
        return client.responses.create(model=conf["model"], input="Say hi.", max_output_tokens=8).output_text
    if kind == "claude":
        import anthropic

        env = json.loads(body)["env"]
        client = anthropic.Anthropic(base_url=env["ANTHROPIC_BASE_URL"], auth_token=env["ANTHROPIC_AUTH_TOKEN"],
                                     max_retries=0)
        texts = [client.messages.create(model=env[name], max_tokens=8, messages=[{"role": "user", "content": "Say hi."}])
                 .content[0].text for name in ("ANTHROPIC_MODEL", "ANTHROPIC_SMALL_FAST_MODEL")]
        return " ".join(texts)
    raise AssertionError(f"no way to try a recipe of kind {kind!r}")


@pytest.mark.parametrize("kind,body", RECIPES, ids=[f"{i}-{k.replace(' ', '-')}" for i, (k, _) in enumerate(RECIPES)])
def test_recipe_works_against_a_real_server(kind: str, body: str, server: Server):
    got = _try(kind, body, server.url)
    assert got.strip(), f"the {kind} recipe got nothing back"


@pytest.mark.parametrize("kind,parse,key", [("continue", yaml.safe_load, "unused"), ("aider", yaml.safe_load, "unused"),
                                            ("codex", tomllib.loads, "tallow"), ("claude", json.loads, "unused")])
def test_recipe_says_what_tallow_launch_writes(kind, parse, key):
    (body,) = [b for k, b in RECIPES if k == kind]
    assert parse(body) == parse(_launch_writes(kind, key))
