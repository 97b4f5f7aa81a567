"""The field table's shaped fields (common/fields.py's SHAPED: output format and schema,
grammar, logit bias, logprobs, tools, reasoning, drafting, adapters, cache use, media)
walked: on every HTTP surface that names one, each of its body fields reaches the request
(a sample per surface below, and a test that there is one for every name); a shaped field's
name from another surface is refused by name; the CLI, /set and tallow.api have what the
table says they have, and tallow.api's keywords reach the sampler."""

from __future__ import annotations

import base64
import inspect
import io
import json
import math
import wave

import pytest
import typer
from helpers.projector import solid_png
from helpers.synth import write_synthetic_gguf
from test_field_table import HTTP, http_parse

from tallow.common.fields import ALL, FIELDS, IN_CONTENT, SHAPED
from tallow.runtime.chat import FIELD_SETTINGS, OWN_SETTINGS
from tallow.wire.fields import APIError
from tallow.wire.request import Limits

LIMITS = Limits(max_tokens=1 << 20, model="m", n_vocab=100, n_adapters=1)
GBNF = 'root ::= "b" | "c"'
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


def png_b64(tmp_path) -> str:
    return base64.b64encode(solid_png(tmp_path / "red.png", (255, 0, 0), 16).read_bytes()).decode()


def wav_b64() -> str:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(b"\0\0" * 1600)
    return base64.b64encode(out.getvalue()).decode()


def user_parts(*parts: dict) -> list[dict]:
    return [{"role": "user", "content": [*parts, {"type": "text", "text": "hi"}]}]


def media_of(p) -> int:
    return sum(len(m.get("media") or ()) for m in p.messages or ())


def samples(tmp_path) -> dict[tuple[str, str], list[tuple[dict, object]]]:
    """(field, surface) -> [(body fields, what the request must then hold)]."""
    img, wav = png_b64(tmp_path), wav_b64()
    uri = "data:image/png;base64," + img
    is_json = (lambda p: p.json_format and p.schema is None)  # noqa: E731
    has_schema = (lambda p: p.json_format and p.schema is not None)  # noqa: E731
    tools_required = (lambda p: p.tools.mode == "required" and not p.tools.parallel)  # noqa: E731
    return {
        ("format", "openai"): [({"response_format": {"type": "json_object"}}, is_json)],
        ("format", "responses"): [({"text": {"format": {"type": "json_object"}}}, is_json)],
        ("format", "ollama"): [({"format": "json"}, is_json), ({"format": {"type": "object"}}, has_schema)],
        ("json_schema", "openai"): [({"json_schema": {"type": "object"}}, has_schema)],
        ("json_schema", "llamacpp"): [({"json_schema": {"type": "object"}}, has_schema)],
        ("grammar", "openai"): [({"grammar": GBNF}, lambda p: p.grammar == GBNF)],
        ("grammar", "llamacpp"): [({"grammar": GBNF}, lambda p: p.grammar == GBNF)],
        ("logit_bias", "openai"): [({"logit_bias": {"5": 2}}, lambda p: p.logit_bias == ((5, 2.0),))],
        ("logit_bias", "responses"): [({"logit_bias": {"5": 2}}, lambda p: p.logit_bias == ((5, 2.0),))],
        ("logit_bias", "llamacpp"): [({"logit_bias": [[5, 2]]}, lambda p: p.logit_bias == ((5, 2.0),))],
        ("logprobs", "openai"): [({"logprobs": True, "top_logprobs": 3}, lambda p: p.logprobs == 3)],
        ("logprobs", "ollama"): [({"logprobs": True, "top_logprobs": 3}, lambda p: p.logprobs == 3)],
        ("logprobs", "llamacpp"): [({"n_probs": 3}, lambda p: p.logprobs == 3 and not p.post_probs),
                                   ({"n_probs": 3, "post_sampling_probs": True}, lambda p: p.post_probs)],
        ("tools", "openai"): [({"tools": [TOOL], "tool_choice": "required", "parallel_tool_calls": False},
                               tools_required)],
        ("tools", "responses"): [({"tools": [{"type": "function", "name": "f"}], "tool_choice": "required",
                                   "parallel_tool_calls": False}, tools_required)],
        ("tools", "anthropic"): [({"tools": [{"name": "f", "input_schema": {"type": "object"}}],
                                   "tool_choice": {"type": "any", "disable_parallel_tool_use": True}}, tools_required)],
        ("tools", "ollama"): [({"tools": [TOOL]}, lambda p: [t.name for t in p.tools.tools] == ["f"])],
        ("reasoning", "openai"): [({"reasoning_budget": 77}, lambda p: p.reasoning_budget == 77),
                                  ({"reasoning_effort": "low"}, lambda p: p.reasoning_budget == 512)],
        ("reasoning", "responses"): [({"reasoning_budget": 77}, lambda p: p.reasoning_budget == 77),
                                     ({"reasoning": {"effort": "low"}}, lambda p: p.reasoning_budget == 512)],
        ("reasoning", "anthropic"): [({"thinking": {"type": "enabled", "budget_tokens": 1500}, "max_tokens": 4000},
                                      lambda p: p.reasoning_budget == 1500)],
        ("reasoning", "ollama"): [({"think": False}, lambda p: p.reasoning_budget == 0)],
        **{("draft", s): [({"draft": "lookup"}, lambda p: p.draft == "lookup")]
           for s in ("openai", "responses", "anthropic", "llamacpp")},
        ("lora", "openai"): [({"lora": [{"id": 0, "scale": 0.5}]}, lambda p: p.lora == (0.5,))],
        ("lora", "llamacpp"): [({"lora": [{"id": 0, "scale": 0.5}]}, lambda p: p.lora == (0.5,))],
        ("cache", "openai"): [({"cache_prompt": False, "save_prompt": True},
                               lambda p: not p.reuse_cache and p.save_prompt)],
        ("cache", "llamacpp"): [({"cache_prompt": False}, lambda p: not p.reuse_cache)],
        ("media", "openai"): [({"messages": user_parts({"type": "image_url", "image_url": {"url": uri}},
                                                       {"type": "input_audio",
                                                        "input_audio": {"data": wav, "format": "wav"}})},
                               lambda p: media_of(p) == 2)],
        ("media", "responses"): [({"input": [{"role": "user", "content": [
            {"type": "input_image", "image_url": uri}, {"type": "input_text", "text": "hi"}]}]},
            lambda p: media_of(p) == 1)],
        ("media", "anthropic"): [({"messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": img}},
            {"type": "text", "text": "hi"}]}]}, lambda p: media_of(p) == 1)],
        ("media", "ollama"): [({"messages": [{"role": "user", "content": "hi", "images": [img]}]},
                               lambda p: media_of(p) == 1),
                              ({"prompt": "hi", "images": [img]}, lambda p: media_of(p) == 1)],  # /api/generate
        ("media", "llamacpp"): [({"prompt": {"prompt_string": "<__media__> hi", "multimodal_data": [img]}},
                                 lambda p: media_of(p) == 1)],
    }


def parse(surface: str, extra: dict):
    """Shaped fields go at the top of an Ollama body, not in its options."""
    return http_parse(surface, extra, options=False, limits=LIMITS)


def test_every_shaped_field_says_what_it_is_on_every_surface():
    for f in SHAPED:
        assert set(f.names) | set(f.absent) == set(ALL) and not set(f.names) & set(f.absent), f.name
        assert f.shape and f.help.endswith(".") and all(why.strip() for why in f.absent.values()), f.name
    assert not {f.name for f in SHAPED} & {f.name for f in FIELDS}


def test_every_shaped_name_on_every_http_surface_reaches_the_request(tmp_path):
    table = samples(tmp_path)
    named = {(f.name, s) for f in SHAPED for s in HTTP if s in f.names}
    assert set(table) == named, "a sample for each shaped field on each HTTP surface that names it"
    for (field, surface), cases in table.items():
        names = {n for n in SHAPED[[f.name for f in SHAPED].index(field)].names[surface] if n not in IN_CONTENT}
        assert names <= {k for body, _ in cases for k in body}, (field, surface, "every name is sent")
        for body, holds in cases:
            assert holds(parse(surface, body)), (field, surface, body)


@pytest.mark.parametrize("surface", HTTP)
def test_a_shaped_name_the_surface_does_not_have_is_refused_by_name(surface):
    own = {n for f in SHAPED for n in f.names.get(surface, ())}
    others = {n for f in SHAPED for s in HTTP if s != surface for n in f.names.get(s, ()) if n not in IN_CONTENT}
    others -= own | {"messages", "prompt", "input"}
    assert others, surface
    for name in sorted(others):
        with pytest.raises(APIError) as err:
            parse(surface, {name: 1})
        assert name in err.value.message, (surface, name, err.value.message)


def test_the_cli_set_and_api_have_what_the_table_says():
    from tallow.api.model import Model, load
    from tallow.cli.app import app
    from tallow.cli.commands.chat import HELP as CHAT_COMMANDS

    command = typer.main.get_command(app)
    run = {opt for p in command.commands["run"].params for opt in getattr(p, "opts", [])}  # type: ignore[attr-defined]
    for f in SHAPED:
        assert set(f.names.get("cli", ())) <= run, f.name
    set_names = {n for f in SHAPED for n in f.names.get("set", ())}
    assert {n for n in set_names if not n.startswith("/")} == set(OWN_SETTINGS) and not set(OWN_SETTINGS) & set(
        FIELD_SETTINGS)
    assert all(n in CHAT_COMMANDS for n in set_names if n.startswith("/"))
    keywords = set(inspect.signature(Model.stream).parameters) | set(inspect.signature(load).parameters)
    assert {n for f in SHAPED for n in f.names.get("api", ())} <= keywords


L = 20.0


@pytest.fixture(scope="module")
def dist_model(tmp_path_factory):
    """After the generation prompt: a 60%, b 30%, c 10%."""
    return write_synthetic_gguf(tmp_path_factory.mktemp("shaped") / "dist.gguf", script={
        "\n": {"a": L + math.log(0.6), "b": L + math.log(0.3), "c": L + math.log(0.1)}})


def test_the_api_s_grammar_format_and_logprobs_reach_the_sampler(dist_model, tmp_path, monkeypatch):
    from tallow import api

    monkeypatch.setenv("TALLOW_HOME", str(tmp_path))
    with api.load(str(dist_model), prompt_cache=False) as model:
        assert model.generate("go", max_tokens=1, temperature=0).text == "a"
        assert model.generate("go", max_tokens=1, temperature=0, grammar=GBNF).text == "b"  # a is not allowed
        events = list(model.stream("go", max_tokens=1, temperature=0, logprobs=2))
        first = events[0]
        assert [model.engine.model.piece(t) for t, _ in first.top_logprobs] == [b"a", b"b"]
        assert math.isclose(first.logprob, math.log(0.6), abs_tol=0.01)
        with pytest.raises(ValueError, match="format must be 'json' or a JSON schema"):
            model.generate("go", format="yaml")
        with pytest.raises(ValueError, match="logprobs must be a whole number from 0 to 20"):
            model.generate("go", logprobs=21)
        with pytest.raises(ValueError, match="not both"):
            model.generate("go", format="json", grammar=GBNF)


def test_the_cli_grammar_flag_constrains_the_answer(dist_model, tmp_path):
    from helpers.processes import run_tallow

    flags = ["--temperature", "0", "-n", "1", "--json", "--no-cache"]
    r = run_tallow(["run", str(dist_model), "go", *flags, "--grammar", GBNF], home=tmp_path)
    assert r.returncode == 0, r.stderr.decode()
    assert json.loads(r.stdout)["text"] == "b"
    (tmp_path / "g.gbnf").write_text(GBNF)
    r = run_tallow(["run", str(dist_model), "go", *flags, "--grammar", str(tmp_path / "g.gbnf")], home=tmp_path)
    assert r.returncode == 0 and json.loads(r.stdout)["text"] == "b", r.stderr.decode()
    r = run_tallow(["run", str(dist_model), "go", *flags, "--grammar", GBNF, "--format", "json"], home=tmp_path)
    assert r.returncode == 2 and "--grammar" in r.stderr.decode(), r.stderr.decode()
