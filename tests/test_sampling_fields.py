"""The sampling fields llama.cpp's and vLLM's clients send, acting on a model whose next-token
distribution is known: after the generation prompt, a 60%, b 30%, c 10% (and the rest of the
vocabulary about e^-20 each). Typical sampling at 0.25 keeps only b, the token whose surprise
is nearest the distribution's entropy; Mirostat 2 with tau 0.5 starts by keeping only tokens
of surprise under 1, which is a alone; plain sampling draws all three."""

from __future__ import annotations

import math

import pytest
from helpers.synth import write_synthetic_gguf

from tallow.runtime.types import FinalEvent, LoadSettings, Sampling
from tallow.wire.fields import APIError
from tallow.wire.openai_api import parse_chat, parse_completion
from tallow.wire.request import Limits

L = 20.0
LIMITS = Limits(max_tokens=64, model="m")


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from tallow.runtime.engine import Engine

    path = write_synthetic_gguf(tmp_path_factory.mktemp("dist") / "dist.gguf", script={
        "\n": {"a": L + math.log(0.6), "b": L + math.log(0.3), "c": L + math.log(0.1)}})
    with Engine(path, LoadSettings(n_ctx=256, n_threads=1)) as e:
        yield e


def _first(engine, **settings) -> str:
    base = Sampling(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    req = engine.request([{"role": "user", "content": "go"}], max_tokens=1,
                         sampling=Sampling(**{**base.__dict__, **settings}))
    return next(e for e in engine.stream(req) if isinstance(e, FinalEvent)).text


def test_plain_sampling_draws_the_whole_distribution(engine):
    drawn = {_first(engine, seed=s) for s in range(24)}
    assert drawn == {"a", "b", "c"}


def test_typical_p_keeps_the_typical_token(engine):
    assert {_first(engine, seed=s, typical_p=0.25) for s in range(12)} == {"b"}


def test_mirostat_2_keeps_the_tokens_under_its_surprise_target(engine):
    assert {_first(engine, seed=s, mirostat=2, mirostat_tau=0.5) for s in range(12)} == {"a"}
    # Mirostat 1 runs too (its first step estimates the distribution's shape)
    assert _first(engine, seed=1, mirostat=1, mirostat_tau=0.5) in {"a", "b", "c"}


def test_the_fields_reach_the_sampler_under_every_name():
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    s = parse_chat({**chat, "typical_p": 0.3, "mirostat": 2, "mirostat_tau": 3, "mirostat_eta": 0.2}, LIMITS).sampling
    assert (s.typical_p, s.mirostat, s.mirostat_tau, s.mirostat_eta) == (0.3, 2, 3, 0.2)
    assert parse_chat({**chat, "repetition_penalty": 1.3}, LIMITS).sampling.repeat_penalty == 1.3
    assert parse_completion({"prompt": "x", "n_predict": 7}, LIMITS).max_tokens == 7
    assert parse_completion({"prompt": "x", "n_predict": -1}, LIMITS).max_tokens == 64
    for bad, param in (({"repeat_penalty": 1.1, "repetition_penalty": 1.2}, "repetition_penalty"),
                       ({"max_tokens": 5, "n_predict": 6}, "n_predict"), ({"mirostat": 3}, "mirostat"),
                       ({"typical_p": 2}, "typical_p"), ({"verbosity": "low"}, "verbosity"),
                       ({"id_slot": "x"}, "id_slot")):
        with pytest.raises(APIError) as err:
            parse_chat({**chat, **bad}, LIMITS)
        assert err.value.param == param, bad


def test_nulls_are_not_set_whatever_the_field():
    body = {"messages": [{"role": "user", "content": "hi"}], "audio": None, "functions": None, "prediction": None,
            "web_search_options": None, "verbosity": None, "n_predict": None, "max_tokens": None}
    assert parse_chat(body, LIMITS).max_tokens == 64
