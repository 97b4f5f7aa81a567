"""Tool calls through the engine: the grammars llama.cpp runs for each format family, a
scripted model that calls a tool in auto mode, and the default model under `required`."""

from __future__ import annotations

import json

import jsonschema
import pytest
from helpers.synth import HERMES, write_synthetic_gguf

from tallow.runtime.engine import Engine
from tallow.runtime.template import ChatTemplate
from tallow.runtime.tools.choice import Tool, ToolChoice, prepare
from tallow.runtime.tools.formats import FORMATS, detect_format
from tallow.runtime.tools.stream import scan
from tallow.runtime.types import LoadSettings, Sampling

CALL = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
CITY = {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city"]}
# No free strings: a random model's arguments end quickly
BOUNDED = {"type": "object", "properties": {"unit": {"enum": ["c", "f"]}, "days": {"type": "integer", "minimum": 1, "maximum": 9},
                                            "metric": {"type": "boolean"}},
           "required": ["unit", "days"], "additionalProperties": False}
TOOLS = (Tool("get_weather", "The weather in a city", CITY), Tool("forecast", "A forecast", BOUNDED))


@pytest.fixture(scope="module")
def hermes_engine(tmp_path_factory):
    path = write_synthetic_gguf(tmp_path_factory.mktemp("hermes") / "hermes.gguf", template=HERMES,
                                script={"\n": "<tool_call>", "<tool_call>": CALL, CALL: "</tool_call>",
                                        "</tool_call>": "<|im_end|>"},
                                extra_tokens=("<tool_call>", "</tool_call>", CALL))
    with Engine(path, LoadSettings(check_memory=False, n_ctx=2048)) as engine:
        yield engine


@pytest.fixture(scope="module")
def random_hermes(tmp_path_factory):
    path = write_synthetic_gguf(tmp_path_factory.mktemp("rh") / "rh.gguf", template=HERMES, seed=7)
    with Engine(path, LoadSettings(check_memory=False, n_ctx=4096)) as engine:
        yield engine


def ask(engine, choice, seed=0, max_tokens=200, **kw):
    request = engine.request([{"role": "user", "content": "What is the weather in Paris?"}], tools=choice,
                             max_tokens=max_tokens, sampling=Sampling(seed=seed, **kw))
    return request, list(engine.stream(request))[-1]


def test_formats_are_detected_from_the_template():
    assert detect_format(HERMES) == "hermes"
    assert detect_format("{{ '[TOOL_CALLS]' }}{% for t in tools %}{% endfor %}") == "mistral"
    assert detect_format("<|start_header_id|>{% if tools %}ipython{% endif %}") == "llama3"
    assert detect_format("{% for m in messages %}{{ m.content }}{% endfor %}") == "generic"
    assert detect_format(None) == "generic"


def test_the_template_gets_tools_calls_and_results_as_hugging_face_passes_them():
    history = [{"role": "user", "content": "weather?"},
               {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "name": "get_weather",
                                                                    "arguments": '{"city": "Paris"}'}]},
               {"role": "tool", "tool_call_id": "c1", "name": "get_weather", "content": "sunny, 21 C"}]
    choice = ToolChoice(TOOLS, "auto", format="hermes")
    messages, tools = prepare(history, choice, HERMES)
    text = ChatTemplate(HERMES, "", "").render(messages, tools=tools)
    assert '"name": "get_weather"' in text and '"description": "The weather in a city"' in text  # not HTML-escaped
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    assert "<tool_response>\nsunny, 21 C\n</tool_response>" in text
    # A template that knows no tools: described in the system message, calls and results as text
    plain = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    messages, tools = prepare(history, ToolChoice(TOOLS, "auto", format="generic"), plain)
    assert tools is None and messages[0]["role"] == "system" and "get_weather" in messages[0]["content"]
    assert json.loads(messages[2]["content"]) == {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}
    assert messages[3]["role"] == "user" and "sunny" in messages[3]["content"]


def test_a_scripted_hermes_model_calls_a_tool_in_auto_mode(hermes_engine):
    request, final = ask(hermes_engine, ToolChoice(TOOLS, "auto", format="hermes"), temperature=0)
    assert request.grammar is None and request.lazy_grammar is not None  # free text until a call opens
    got = scan(final.text, "hermes", final=True)
    assert [(c.name, json.loads(c.arguments)) for c in got.calls] == [("get_weather", {"city": "Paris"})]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("mode", ["required", "named"])
def test_required_and_named_calls_always_parse_and_validate(random_hermes, fmt, mode):
    """A random model, constrained by each format's grammar from the first token: every
    answer is a call to an offered tool whose arguments validate."""
    choice = ToolChoice(TOOLS[1:], mode, "forecast" if mode == "named" else None, parallel=False, format=fmt)
    for seed in range(3):
        request, final = ask(random_hermes, choice, seed=seed, max_tokens=400)
        assert request.grammar is not None
        got = scan(final.text, fmt, final=True)
        assert got.error is None and len(got.calls) == 1, final.text
        assert got.calls[0].name == "forecast"
        jsonschema.validate(json.loads(got.calls[0].arguments), BOUNDED)


@pytest.mark.parametrize("fmt", ["hermes", "mistral", "llama3"])
def test_lazy_grammars_after_every_opening_are_accepted_by_llama_cpp(random_hermes, fmt):
    from tallow.runtime.tools.constrain import constrain

    _, lazy = constrain(ToolChoice(TOOLS, "auto", format=fmt))
    opening = lazy.grammar.opening
    for n in range(len(opening) + 1):  # the grammar for the rest of a call opened this far
        sampler = random_hermes.sampler_for(random_hermes.request([{"role": "user", "content": "x"}],
                                                                  grammar=lazy.grammar.after(opening[:n])))
        sampler.close()


@pytest.mark.slow
@pytest.mark.default_model
def test_the_default_model_under_required_always_calls_with_valid_arguments(default_engine):
    """SmolLM2's template knows no tools: the generic format, 50 seeds."""
    choice = ToolChoice(TOOLS[:1], "required", format=default_engine.tool_format())
    assert choice.format == "generic"
    for seed in range(50):
        _, final = ask(default_engine, choice, seed=seed, max_tokens=400)
        got = scan(final.text, "generic", final=True)
        assert got.error is None and got.calls, (seed, final.text)
        for call in got.calls:
            assert call.name == "get_weather"
            jsonschema.validate(json.loads(call.arguments), CITY)
