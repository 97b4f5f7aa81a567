"""The field table (common/fields.py) walked: for every request field and every surface that
names it, a value sent under that name reaches the request the engine gets; a value out of
range is refused with the table's range; and a name a surface does not have is refused by
name. Then the sampler itself, through the CLI and tallow.api, on a model whose next-token
distribution is known (as tests/test_sampling_fields.py): Mirostat keeps the likeliest token."""

from __future__ import annotations

import json
import math
from dataclasses import fields as dataclass_fields

import pytest
import typer
from helpers.processes import run_tallow
from helpers.synth import write_synthetic_gguf

from tallow.common.fields import ALL, BY_NAME, FIELDS, SAMPLING, Field
from tallow.models.modelfile import parse as parse_modelfile
from tallow.runtime.chat import ChatSettings, Conversation
from tallow.runtime.opening import RequestDefaults
from tallow.runtime.types import Sampling
from tallow.wire import anthropic_api, llamacpp_api, ollama_api, openai_api, responses_api
from tallow.wire.fields import APIError
from tallow.wire.request import Limits

LIMITS = Limits(max_tokens=1 << 20, model="m", n_vocab=100)
LOADED = ollama_api.Loaded(capacity=4096, threads=1, gpu_layers=0)
USER = [{"role": "user", "content": "hi"}]
HTTP = ("openai", "responses", "anthropic", "ollama", "llamacpp")


def value_for(f: Field):
    """A valid value of `f` that is not its default."""
    if f.many:
        return ["zz"]
    if f.kind is int:
        return next(v for v in (3, int(f.high or 0)) if f.low <= v <= f.high and v != f.default)
    mid = (f.low + f.high) / 2
    return mid if mid != f.default else (f.low + mid) / 2


def bad_value(f: Field):
    return None if f.high is None else (f.high + 1 if f.kind is int else f.high * 2 + 1)


def http_parse(surface: str, extra: dict, options: bool = True, limits: Limits = LIMITS):
    """The request `extra` (the fields under test) makes on `surface`; on Ollama's, inside
    `options` unless told otherwise, and a body with a prompt is a /api/generate one."""
    if surface == "openai":
        return openai_api.parse_chat({"messages": USER, **extra}, limits)
    if surface == "responses":
        return responses_api.parse({"input": "hi", **extra}, limits, None)
    if surface == "anthropic":
        return anthropic_api.parse({"messages": USER, "max_tokens": 64, **extra}, limits)
    if surface == "ollama" and "prompt" in extra:
        return ollama_api.parse_generate(extra, limits, LOADED)
    if surface == "ollama":
        body = {"messages": USER, "options": extra} if options else {"messages": USER, **extra}
        return ollama_api.parse_chat(body, limits, LOADED)
    return llamacpp_api.parse({"prompt": "hi", **extra}, limits)


def reached(f: Field, parsed) -> object:
    if f.sampling:
        return getattr(parsed.sampling, f.name)
    return list(parsed.stop) if f.name == "stop" else parsed.max_tokens


def test_every_field_says_what_it_is_on_every_surface():
    for f in FIELDS:
        assert set(f.names) | set(f.absent) == set(ALL) and not set(f.names) & set(f.absent), f.name
        assert all(why.strip() for why in f.absent.values()) and f.help.endswith((".", "]")), f.name
        if f.low is not None and f.default is not None:
            assert f.low <= f.default <= f.high, f.name
    # Sampling's fields are the table's sampling rows, with the table's defaults
    assert {d.name: d.default for d in dataclass_fields(Sampling)} == {f.name: f.default for f in SAMPLING}


@pytest.mark.parametrize("surface", HTTP)
def test_every_http_name_reaches_the_request_and_its_range_is_the_table_s(surface):
    for f in FIELDS:
        for name in f.names.get(surface, ()):
            value = value_for(f)
            got = reached(f, http_parse(surface, {name: value}))
            want = value if not f.many else value
            assert got == want, (surface, name, got, want)
            bad = bad_value(f)
            if bad is not None:
                with pytest.raises(APIError) as err:
                    http_parse(surface, {name: bad})
                assert "must be between" in err.value.message and name in err.value.message, err.value.message


@pytest.mark.parametrize("surface", HTTP)
def test_a_name_the_surface_does_not_have_is_refused_by_name(surface):
    own = {n for f in FIELDS for n in f.names.get(surface, ())}
    others = {n for f in FIELDS for s in HTTP for n in f.names.get(s, ()) if s != surface} - own
    assert others, surface
    for name in sorted(others):
        with pytest.raises(APIError) as err:
            http_parse(surface, {name: 1})
        assert name in err.value.message, (surface, name, err.value.message)


def test_one_temperature_range_everywhere(tmp_path):
    t = BY_NAME["temperature"]
    for surface in HTTP:
        with pytest.raises(APIError, match="between 0 and 2"):
            http_parse(surface, {t.names[surface][0]: 2.5})
    with pytest.raises(Exception, match="between 0 and 2"):
        parse_modelfile("FROM m\nPARAMETER temperature 2.5\n")
    conv = Conversation(None, ChatSettings(Sampling()))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="between 0 and 2"):
        conv.set("temperature", "2.5")
    r = run_tallow(["run", "nothing-stored", "hi", "--temperature", "7"], home=tmp_path)
    assert r.returncode == 2 and "between 0 and 2" in r.stderr.decode(), r.stderr


def test_every_modelfile_parameter_becomes_the_request_default():
    for f in FIELDS:
        name = f.on("modelfile")
        value = value_for(f)
        text = "\n".join(f"PARAMETER {name} {v}" for v in value) if f.many else f"PARAMETER {name} {value}"
        defaults = RequestDefaults.of(parse_modelfile(f"FROM m\n{text}\n").preset)
        got = getattr(defaults.sampling, f.name) if f.sampling else (
            list(defaults.stop) if f.many else defaults.max_tokens)
        assert got == value, (name, got, value)


def test_every_set_name_reaches_the_chat_s_settings_and_an_absent_one_is_refused():
    conv = Conversation(None, ChatSettings(Sampling()))  # type: ignore[arg-type]
    for f in FIELDS:
        if f.on("set") is None:
            with pytest.raises(ValueError, match="unknown setting"):
                conv.set(f.name, "x")
            continue
        value = value_for(f)
        conv.set(f.on("set"), str(value))
        got = getattr(conv.settings.sampling, f.name) if f.sampling else conv.settings.max_tokens
        assert got == value, (f.name, got, value)
        bad = bad_value(f)
        if bad is not None:
            with pytest.raises(ValueError, match="must be between"):
                conv.set(f.on("set"), str(bad))


def test_every_cli_flag_is_on_run_and_chat_with_the_table_s_range():
    from tallow.cli.app import app

    command = typer.main.get_command(app)
    for name in ("run", "chat"):
        sub = command.commands[name]  # type: ignore[attr-defined]
        params = {opt: p for p in sub.params for opt in getattr(p, "opts", [])}
        for f in FIELDS:
            flag = f.on("cli")
            assert flag in params, (name, flag)
            value = value_for(f)
            raw = value[0] if f.many else str(value)
            ctx = sub.make_context(name, ["m", flag, raw] if name == "run" else ["m", flag, raw])
            assert ctx.params[f.name] == value, (name, flag, ctx.params[f.name])
            bad = bad_value(f)
            if bad is not None:
                with pytest.raises(typer.BadParameter, match="must be between"):
                    sub.make_context(name, ["m", flag, str(bad)])


def test_the_api_takes_every_field_by_its_keyword_and_checks_it():
    from tallow.api.model import Model

    class Quiet:  # Model only reads an engine's notes until it streams
        notes: list[str] = []

    model = Model("m", Quiet())
    for f in FIELDS:
        key = f.on("api")
        value = value_for(f)
        if f.name == "max_tokens":
            got = model.options(value, None, {})["max_tokens"]
        elif f.name == "stop":
            got = list(model.options(None, tuple(value), {})["stop"])
        else:
            got = getattr(model.options(None, None, {key: value})["sampling"], f.name)
        assert got == value, (key, got, value)
        bad = bad_value(f)
        if bad is not None and f.sampling:
            with pytest.raises(ValueError, match="must be between"):
                model.options(None, None, {key: bad})
    with pytest.raises(TypeError, match="unknown sampling settings: num_predict"):
        model.options(None, None, {"num_predict": 3})


L = 20.0


@pytest.fixture(scope="module")
def dist_model(tmp_path_factory):
    """After the generation prompt: a 60%, b 30%, c 10%."""
    return write_synthetic_gguf(tmp_path_factory.mktemp("dist") / "dist.gguf", script={
        "\n": {"a": L + math.log(0.6), "b": L + math.log(0.3), "c": L + math.log(0.1)}})


def test_mirostat_and_typical_p_reach_the_sampler_from_the_cli(dist_model, tmp_path):
    flat = ["--temperature", "1", "--top-k", "0", "--top-p", "1", "--min-p", "0", "-n", "1", "--json"]

    def first(*extra: str) -> set[str]:
        out = set()
        for seed in range(5):
            r = run_tallow(["run", str(dist_model), "go", *flat, "--seed", str(seed), *extra], home=tmp_path)
            assert r.returncode == 0, r.stderr.decode()
            out.add(json.loads(r.stdout)["text"])
        return out

    assert first("--mirostat", "2", "--mirostat-tau", "0.5") == {"a"}
    assert first("--typical-p", "0.25") == {"b"}
