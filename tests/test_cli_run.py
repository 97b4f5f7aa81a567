"""`tallow run` end to end on the default model, in fresh processes, as users and scripts run it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from helpers.processes import run_tallow

from tallow.runtime.types import FinalEvent, Request, Sampling

MODEL = "smollm2:135m"
GREEDY = ["--temperature", "0"]


def as_json(r: subprocess.CompletedProcess) -> dict:
    assert r.returncode == 0, r.stderr.decode()
    return json.loads(r.stdout)


@pytest.mark.slow
def test_streamed_text_equals_json_text(default_home):
    args = ["run", MODEL, "Name three colours.", "-n", "40", *GREEDY]
    plain = run_tallow(args, home=default_home)
    data = as_json(run_tallow([*args, "--json"], home=default_home))
    assert plain.returncode == 0
    text = data["text"]
    assert text.strip()
    assert plain.stdout.decode() == text + ("" if text.endswith("\n") else "\n")


def test_json_usage_and_timings_are_consistent(default_home, default_engine):
    data = as_json(run_tallow(["run", MODEL, "Why is the sky blue?", "-n", "30", *GREEDY, "--json"], home=default_home))
    expected_prompt = default_engine.prompt_for([{"role": "user", "content": "Why is the sky blue?"}])
    u, t = data["usage"], data["timings"]
    assert data["model"] == MODEL
    assert u["prompt_tokens"] == len(expected_prompt)
    assert u["cached_tokens"] == 0
    assert u["completion_tokens"] == t["decode_tokens"] == 30
    assert data["finish_reason"] == "length"
    for key in ("load_ms", "ttft_ms", "prefill_ms", "prefill_tps", "decode_ms", "decode_tps", "itl_p50_ms", "itl_p95_ms", "total_ms"):
        assert t[key] > 0, key
    assert t["prefill_ms"] <= t["ttft_ms"] <= t["total_ms"]
    assert t["itl_p50_ms"] <= t["itl_p95_ms"]
    assert t["prefill_tps"] == pytest.approx(u["prompt_tokens"] / t["prefill_ms"] * 1000, rel=0.01)
    assert t["decode_tps"] == pytest.approx(30 / t["decode_ms"] * 1000, rel=0.01)
    from tallow.runtime.backend import supports_gpu_offload

    load = data["load"]  # what the load decided: on a CPU build, the calibration's flash attention
    assert load["flash_attn"] in ("on", "off") if not supports_gpu_offload() else load["flash_attn"] == "auto"
    assert load["gpu_layers"] == (0 if not supports_gpu_offload() else 30) and load["n_ctx"] >= 64


@pytest.mark.slow
def test_same_seed_same_text_across_processes(default_home):
    greedy = ["run", MODEL, "Tell me a short story about a cat.", "-n", "48", "--json", *GREEDY]
    seeded = ["run", MODEL, "Tell me a short story about a cat.", "-n", "48", "--json", "--seed", "42", "--temperature", "0.9"]
    assert as_json(run_tallow(greedy, home=default_home))["text"] == as_json(run_tallow(greedy, home=default_home))["text"]
    a = as_json(run_tallow(seeded, home=default_home))["text"]
    b = as_json(run_tallow(seeded, home=default_home))["text"]
    c = as_json(run_tallow([*seeded[:-4], "--seed", "43", "--temperature", "0.9"], home=default_home))["text"]
    assert a == b
    assert a != c


def test_piped_stdin_goes_before_the_prompt(default_home, default_engine):
    notes = "The meeting moved to Thursday at 3pm in room 12."
    data = as_json(run_tallow(["run", MODEL, "When is the meeting?", "-n", "20", *GREEDY, "--json"],
                              home=default_home, input=notes.encode() + b"\n"))
    combined = f"{notes}\n\nWhen is the meeting?"
    assert data["usage"]["prompt_tokens"] == len(default_engine.prompt_for([{"role": "user", "content": combined}]))


def test_invalid_utf8_on_stdin_is_replaced_not_fatal(default_home):
    r = run_tallow(["run", MODEL, "-n", "5", *GREEDY], home=default_home, input=b"caf\xe9 \xff\xfe bytes")
    assert r.returncode == 0, r.stderr.decode()
    assert r.stdout.strip()


def test_stop_string_is_not_printed(default_home):
    base = ["run", MODEL, "Count from 1 to 20, separated by commas.", "-n", "60", *GREEDY]
    free = as_json(run_tallow([*base, "--json"], home=default_home))["text"]
    assert "5" in free
    r = run_tallow([*base, "--stop", "5"], home=default_home)
    assert r.returncode == 0
    assert r.stdout.decode().rstrip("\n") == free[: free.index("5")].rstrip("\n")


@pytest.mark.slow
def test_unicode_heavy_output_detokenizes_exactly(default_engine):
    prompt = default_engine.prompt_for([{"role": "user", "content": "Écris une phrase en français avec des accents, puis en japonais: こんにちは 世界 🎉"}])
    tokens, texts, final = [], [], None
    for ev in default_engine.stream(Request(prompt, 300, (), Sampling(temperature=1.0, seed=1), ignore_eos=True)):
        if isinstance(ev, FinalEvent):
            final = ev
        else:
            tokens.append(ev.token)
            texts.append(ev.text)
    streamed = "".join(texts) + final.tail
    assert any(ord(ch) > 127 for ch in streamed)
    assert streamed == final.text == default_engine.model.detokenize(tokens).decode("utf-8", errors="replace")


def test_stats_line_on_request_only_when_not_a_terminal(default_home):
    args = ["run", MODEL, "Hi", "-n", "5", *GREEDY]
    assert b"TTFT" not in run_tallow(args, home=default_home).stderr
    forced = run_tallow([*args, "--stats"], home=default_home).stderr.decode()
    assert "TTFT" in forced and "decode" in forced and "\x1b[" not in forced
    assert b"TTFT" not in run_tallow([*args, "--stats", "--quiet"], home=default_home).stderr


@pytest.mark.parametrize(
    "ref, message",
    [
        ("nosuch:model", "model 'nosuch:model' not found"),
        ("/nonexistent/model.gguf", "no such file"),
        ("Bad Name!", "invalid model name"),
    ],
)
def test_missing_model_is_one_line_with_a_hint(default_home, ref, message):
    r = run_tallow(["run", ref, "hi"], home=default_home)
    err = r.stderr.decode()
    assert r.returncode == 1
    assert message in err and "hint:" in err
    assert "Traceback" not in err


def test_bad_files_are_refused_before_llama_cpp(default_home, default_model, tmp_path):
    not_gguf = tmp_path / "notes.gguf"
    not_gguf.write_text("just text")
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(default_model.read_bytes()[:1000])
    a_dir = tmp_path / "dir.gguf"
    a_dir.mkdir()
    for path, message in ((not_gguf, "not a GGUF file"), (truncated, "truncated or corrupt"), (a_dir, "is a directory")):
        r = run_tallow(["run", str(path), "hi"], home=default_home)
        assert r.returncode == 1 and message in r.stderr.decode(), r.stderr.decode()
        assert b"Traceback" not in r.stderr


def test_debug_shows_the_traceback(default_home):
    r = run_tallow(["run", "nosuch:model", "hi"], home=default_home, env={"TALLOW_DEBUG": "1"})
    assert r.returncode == 1 and b"Traceback" in r.stderr


def test_prompt_longer_than_context_names_both_counts(default_home):
    r = run_tallow(["run", MODEL, "word " * 600, "--ctx", "300"], home=default_home)
    err = r.stderr.decode()
    assert r.returncode == 1
    assert re.search(r"the prompt is 6\d\d tokens but the context holds \d+", err), err
    assert "--ctx" in err and "Traceback" not in err


def test_empty_prompt_is_a_usage_error(default_home):
    r = run_tallow(["run", MODEL], home=default_home, input=b"")
    assert r.returncode == 2
    assert b"empty" in r.stderr


def test_ctrl_c_stops_prints_partial_answer_and_stats(default_home):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TALLOW_")}
    env.update(TALLOW_HOME=str(default_home), NO_COLOR="1")
    # Restore Python's SIGINT handler in case this test runs under a shell that ignores SIGINT.
    code = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler);"
            "sys.argv=['tallow','run','smollm2:135m','Write a very long essay about the ocean.','--stats',"
            "'--temperature','0','--max-tokens','2000']; from tallow.cli.app import main; main()")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)
    first = proc.stdout.read(20)  # the answer has started streaming
    assert first
    proc.send_signal(signal.SIGINT)
    started = time.monotonic()
    rest, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err.decode()
    assert time.monotonic() - started < 30  # stops promptly, not after 2000 tokens
    assert (first + rest).strip()
    stats = err.decode()
    assert "TTFT" in stats and "interrupted" in stats


@pytest.mark.slow
def test_lookup_draft_gives_the_same_answer_and_reports_acceptance(default_home):
    args = ["run", MODEL, "Repeat exactly: the quick brown fox jumps over the lazy dog, the quick brown fox jumps.",
            "-n", "40", *GREEDY, "--json", "--no-cache"]
    plain = as_json(run_tallow(args, home=default_home))
    fast = as_json(run_tallow([*args, "--draft", "lookup"], home=default_home))
    assert fast["text"] == plain["text"]
    assert fast["usage"]["draft_tokens"] >= fast["usage"]["accepted_tokens"] > 0
    stats = run_tallow([*args[:-2], "--stats", "--draft", "lookup"], home=default_home).stderr.decode()
    assert "accepted (" in stats
    bad = run_tallow([*args, "--draft", "tiny-model"], home=default_home)  # any other value names a draft model
    assert bad.returncode == 1 and b"model 'tiny-model' not found" in bad.stderr, bad.stderr


def test_json_logprobs_per_token_as_the_api_gives_them(synth_model, tmp_path):
    # fixed threads and flash attention: drafting turns flash attention on, and "auto" for the
    # plain run follows this machine's calibration, which may choose off; either difference
    # changes the order llama.cpp sums in (CI saw 1e-3 apart, twice)
    r = run_tallow(["run", str(synth_model), "hello", "--json", "--logprobs", "3", "-n", "6", "--temperature", "0",
                    "--no-log", "-t", "2", "--flash-attn", "on"], home=tmp_path)
    assert r.returncode == 0, r.stderr.decode()
    out = json.loads(r.stdout)
    content = out["logprobs"]["content"]
    assert len(content) == out["usage"]["completion_tokens"] > 0
    for entry in content:
        assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"} and entry["logprob"] <= 0
        top = [t["logprob"] for t in entry["top_logprobs"]]
        assert len(top) == 3 and top == sorted(top, reverse=True)
        assert entry["top_logprobs"][0]["bytes"] == entry["bytes"]  # greedy: the chosen token is the likeliest
        assert abs(entry["top_logprobs"][0]["logprob"] - entry["logprob"]) < 1e-9
    plain = json.loads(run_tallow(["run", str(synth_model), "hello", "--json", "-n", "6", "--temperature", "0",
                                   "--no-log"], home=tmp_path).stdout)
    assert "logprobs" not in plain and plain["text"] == out["text"]  # asked for only, and the answer is the same
    # lookup drafts are a feature of the same decode path: the same tokens, the same figures
    drafted = json.loads(run_tallow(["run", str(synth_model), "hello", "--json", "--logprobs", "3", "-n", "6",
                                     "--temperature", "0", "--no-log", "--draft", "lookup", "-t", "2", "--flash-attn", "on"],
                                        home=tmp_path).stdout)
    assert drafted["text"] == out["text"]
    assert [e["token"] for e in drafted["logprobs"]["content"]] == [e["token"] for e in content]
    assert all(abs(a["logprob"] - b["logprob"]) < 1e-3 for a, b in zip(drafted["logprobs"]["content"], content))
    for args, words in ((["--logprobs", "2"], "add --json"), (["--json", "--logprobs", "21"], "--logprobs")):
        bad = run_tallow(["run", str(synth_model), "hello", *args], home=tmp_path)
        assert bad.returncode == 2 and words in bad.stderr.decode(), bad.stderr.decode()
