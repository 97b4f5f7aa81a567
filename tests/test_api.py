"""The public Python API (tallow.api): a stored model by name, streamed events, the same
usage, timings and answer as `tallow run`; a model that is not stored is an error that
downloads nothing."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers.processes import run_tallow, tallow_env

SCRIPT = r"""
import json, sys
from tallow import api

with api.load(sys.argv[1], ctx=1024, flash_attn="off") as model:  # as the run below
    events = list(model.stream("Why is the sky blue?", max_tokens=24, temperature=0))
    tokens = [e for e in events if isinstance(e, api.TokenEvent)]
    finals = [e for e in events if isinstance(e, api.FinalEvent)]
    again = model.generate("Why is the sky blue?", max_tokens=24, temperature=0)
    print(json.dumps({"final": finals[0].to_dict(), "text": finals[0].text, "last_is_final": events[-1] is finals[0],
                      "n_finals": len(finals), "joined": "".join(t.text for t in tokens) + finals[0].tail,
                      "again": again.text, "again_cached": again.usage.cached_tokens, "name": model.name}))
"""


def _api(args: list[str], home, code: str = SCRIPT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          env=tallow_env(home, {"TALLOW_OFFLINE": "1", "TALLOW_NO_LOG": "1"}), timeout=300)


@pytest.mark.default_model
def test_a_stored_model_streams_the_answer_tallow_run_gives(default_home):
    got = _api(["smollm2:135m"], default_home)
    assert got.returncode == 0, got.stderr
    out = json.loads(got.stdout)
    final = out["final"]
    assert out["name"] == "smollm2:135m" and out["n_finals"] == 1 and out["last_is_final"]
    assert out["joined"] == out["text"] and out["text"].strip()
    assert 0 < final["usage"]["completion_tokens"] <= 24 and final["usage"]["prompt_tokens"] > 5
    assert 0 < final["timings"]["ttft_ms"] <= final["timings"]["total_ms"]
    # The second answer reuses the prefix the sequence holds (its text is not compared: the last
    # prompt token then goes through llama.cpp alone, which rounds differently; DESIGN.md,
    # "Batch invariance").
    assert out["again_cached"] > 0 and out["again"].strip()
    cli = run_tallow(["run", "smollm2:135m", "Why is the sky blue?", "-n", "24", "--temperature", "0", "--ctx", "1024",
                      "--flash-attn", "off", "--json", "--no-log"], home=default_home)
    assert cli.returncode == 0, cli.stderr.decode()
    assert json.loads(cli.stdout)["text"] == out["text"]


def test_a_model_that_is_not_stored_is_an_error_and_nothing_is_fetched(tmp_path):
    code = ("from tallow import api\ntry:\n    api.load('qwen2.5:0.5b')\nexcept api.TallowError as e:\n"
            "    print(e.message, '|', e.hint)\n")
    got = _api([], tmp_path, code)
    assert got.returncode == 0, got.stderr
    assert "not stored" in got.stdout and "tallow pull qwen2.5:0.5b" in got.stdout
    assert not (tmp_path / "models" / "blobs").exists() or not any((tmp_path / "models" / "blobs").iterdir())


def test_unknown_sampling_settings_and_load_options_are_refused(synth_model, tmp_path):
    code = ("import sys\nfrom tallow import api\nm = api.load(sys.argv[1], ctx=256)\n"
            "try:\n    list(m.stream('hi', temprature=0))\nexcept TypeError as e:\n    print(e)\n"
            "try:\n    api.load(sys.argv[1], flash_attn='maybe')\nexcept ValueError as e:\n    print(e)\n")
    got = _api([str(synth_model)], tmp_path, code)
    assert got.returncode == 0, got.stderr
    assert "unknown sampling settings: temprature" in got.stdout and "flash_attn must be auto, on or off" in got.stdout
