"""The Modelfile parser, table-driven: every directive, the three ways to write a value,
multi-line values, and each error with the line it names; and render, read back the same."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tallow.models.modelfile import ModelfileError, parse, render
from tallow.models.preset import PARAMETERS, Preset, PresetError, check_param

GOOD = [
    # (Modelfile, what it must give: source, parameters, system, template, messages, adapters, license)
    ("FROM smollm2:135m", dict(source="smollm2:135m")),
    ("from ./model.gguf\n", dict(source="./model.gguf")),
    ("# comment\n\n  FROM org/repo:Q4_K_M  \n", dict(source="org/repo:Q4_K_M")),
    ("FROM m\nPARAMETER temperature 0.2\nPARAMETER top_k 20\nPARAMETER TOP_P 0.5\nparameter min_p 0",
     dict(parameters={"temperature": 0.2, "top_k": 20, "top_p": 0.5, "min_p": 0.0})),
    ("FROM m\nPARAMETER num_ctx 2048\nPARAMETER num_predict 64\nPARAMETER seed 7\nPARAMETER repeat_last_n 32\n"
     "PARAMETER repeat_penalty 1.1\nPARAMETER num_thread 2\nPARAMETER num_gpu 0",
     dict(parameters={"num_ctx": 2048, "num_predict": 64, "seed": 7, "repeat_last_n": 32, "repeat_penalty": 1.1,
                      "num_thread": 2, "num_gpu": 0})),
    ("FROM m\nPARAMETER typical_p 0.9\nPARAMETER mirostat 2\nPARAMETER mirostat_tau 4\nPARAMETER mirostat_eta 0.2",
     dict(parameters={"typical_p": 0.9, "mirostat": 2, "mirostat_tau": 4.0, "mirostat_eta": 0.2})),
    ("FROM m\nPARAMETER stop <|im_end|>\nPARAMETER stop \"User:\"\nPARAMETER stop \"\"\"a b\"\"\"",
     dict(parameters={"stop": ["<|im_end|>", "User:", "a b"]})),
    ("FROM m\nPARAMETER cache_type_k Q8_0\nPARAMETER cache_type_v q4_0",
     dict(parameters={"cache_type_k": "q8_0", "cache_type_v": "q4_0"})),
    ("FROM m\nPARAMETER frequency_penalty 0.5\nPARAMETER presence_penalty -0.5",
     dict(parameters={"frequency_penalty": 0.5, "presence_penalty": -0.5})),
    ("FROM m\nSYSTEM You are terse.", dict(system="You are terse.")),
    ('FROM m\nSYSTEM "Say \\"hi\\"\\nthen stop"', dict(system='Say "hi"\nthen stop')),
    ('FROM m\nSYSTEM """\n  Two\n  lines\n"""', dict(system="Two\n  lines")),
    ('FROM m\nSYSTEM """one line"""', dict(system="one line")),
    ('FROM m\nTEMPLATE """{% for m in messages %}{{ m.content }}\n{% endfor %}"""',
     dict(template="{% for m in messages %}{{ m.content }}\n{% endfor %}")),
    ('FROM m\nTEMPLATE """\n{{ x }}\n"""', dict(template="\n{{ x }}\n")),  # a template is kept as written
    ("FROM m\nMESSAGE user Hello\nMESSAGE assistant Hi there\nMESSAGE SYSTEM \"\"\"be\nbrief\"\"\"",
     dict(messages=(("user", "Hello"), ("assistant", "Hi there"), ("system", "be\nbrief")))),
    ("FROM m\nADAPTER ./lora.gguf\nADAPTER /abs/two.gguf", dict(adapters=[("./lora.gguf", 2), ("/abs/two.gguf", 3)])),
    ('FROM m\nLICENSE MIT\nLICENSE """Apache\n2.0"""', dict(license="MIT\n\nApache\n2.0")),
    ("FROM m\r\nSYSTEM windows\r\n", dict(system="windows")),
    ("FROM\tm\nPARAMETER\ttemperature\t1", dict(source="m", parameters={"temperature": 1.0})),
]

BAD = [
    # (Modelfile, the line named, words the message holds)
    ("FROM m\nPARAMETR temperature 1", 2, "unknown directive 'PARAMETR'"),
    ("FROM m\n\nPARAMETER tempreature 1", 3, "unknown parameter 'tempreature'"),
    ("FROM m\nPARAMETER tfs_z 1", 2, "does not implement the parameter tfs_z"),
    ("FROM m\nPARAMETER temperature warm", 2, "temperature wants a number, not 'warm'"),
    ("FROM m\nPARAMETER top_k 2.5", 2, "top_k wants a whole number"),
    ("FROM m\nPARAMETER top_p 3", 2, "top_p must be between 0 and 1"),
    ("FROM m\nPARAMETER num_ctx 8", 2, "num_ctx must be between 16"),
    ("FROM m\nPARAMETER cache_type_k q3", 2, "cache_type_k must be one of"),
    ("FROM m\nPARAMETER temperature nan", 2, "temperature wants a number"),
    ("FROM m\nPARAMETER temperature", 2, "PARAMETER needs a name and a value"),
    ("PARAMETER temperature 1\nSYSTEM hi", 1, "no FROM"),
    ("", 1, "no FROM"),
    ("FROM a\nFROM b", 2, "a second FROM (the first is on line 1)"),
    ("FROM m\nSYSTEM a\nSYSTEM b", 3, "a second SYSTEM (the first is on line 2)"),
    ("FROM m\nSYSTEM", 2, "SYSTEM has no value"),
    ('FROM m\nSYSTEM """never\nclosed', 2, 'a """ value is never closed'),
    ('FROM m\nSYSTEM """a"""b', 2, 'text after the closing """'),
    ('FROM m\nSYSTEM """a\nb""" c', 3, 'text after the closing """'),
    ('FROM m\nSYSTEM "open', 2, "a quoted value is never closed"),
    ('FROM m\nSYSTEM "a" b', 2, "text after the closing quote"),
    ("FROM m\nMESSAGE robot hi", 2, "role is system, user or assistant, not 'robot'"),
    ("FROM m\nMESSAGE user", 2, "MESSAGE needs a role and its content"),
    ('FROM m\nSYSTEM """\nok\n"""\nBOGUS x', 5, "unknown directive 'BOGUS'"),  # lines counted past a long value
]


@pytest.mark.parametrize("text,want", GOOD)
def test_each_directive_and_way_of_quoting_is_read(text, want):
    mf = parse(text)
    got = dict(source=mf.source, parameters=mf.preset.parameters, system=mf.preset.system,
               template=mf.preset.template, messages=mf.preset.messages, adapters=mf.adapters, license=mf.license)
    for key, value in want.items():
        assert got[key] == value, (key, got)
    assert all(got[k] in (None, {}, (), []) for k in got if k not in want and k != "source")


@pytest.mark.parametrize("text,line,words", BAD)
def test_each_error_names_its_line(text, line, words):
    with pytest.raises(ModelfileError) as err:
        parse(text, where="Modelfile")
    assert err.value.line == line
    assert err.value.message.startswith(f"Modelfile line {line}: ") and words in err.value.message, err.value.message


def test_every_parameter_is_covered_by_the_table():
    named = {name for text, want in GOOD for name in want.get("parameters", {})}
    assert named == set(PARAMETERS)


texts = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\x00"), min_size=1, max_size=40)
words = st.text("abcXYZ019_<|>.", min_size=1, max_size=12)


@settings(max_examples=300, deadline=None)
@given(system=texts, template=texts, content=texts, stop=st.lists(texts, min_size=1, max_size=3),
       temperature=st.floats(0, 2), seed=st.integers(0, 2**32 - 1), role=st.sampled_from(["user", "assistant"]),
       lic=st.one_of(st.none(), texts))
def test_render_is_read_back_the_same(system, template, content, stop, temperature, seed, role, lic):
    """Whatever the text (quotes, triple quotes, newlines, leading spaces), show --modelfile's
    output parses to the same settings."""
    preset = Preset({"temperature": temperature, "seed": seed, "stop": stop}, system.strip() or "x", template,
                    ((role, content.strip() or "y"),))
    lic = lic.strip() if lic and lic.strip() else None
    mf = parse(render("smollm2:135m", preset, license=lic))
    assert mf.source == "smollm2:135m" and mf.preset == preset and mf.license == lic


def test_preset_json_round_trip_and_stored_values_are_checked_again():
    preset = Preset({"temperature": 0.0, "stop": ["a", "b"], "num_ctx": 64}, "sys", "{{ x }}", (("user", "hi"),))
    assert Preset.from_json(preset.to_json()) == preset
    assert Preset({"top_k": 5}).over(preset) == Preset({"temperature": 0.0, "stop": ["a", "b"], "num_ctx": 64,
                                                        "top_k": 5}, "sys", "{{ x }}", (("user", "hi"),))
    with pytest.raises(PresetError, match="num_ctx must be between"):
        Preset.from_json({"parameters": {"num_ctx": 1}})
    with pytest.raises(PresetError, match="seed wants a whole number"):
        check_param("seed", True)
