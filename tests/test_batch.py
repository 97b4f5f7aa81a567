"""tallow batch on the tiny synthetic model: records, errors by line, resuming after a kill."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from helpers.processes import run_tallow


def write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_results_and_error_records_by_line(synth_model, tmp_path):
    msg = lambda text: [{"role": "user", "content": text}]  # noqa: E731
    src = write_jsonl(tmp_path / "in.jsonl", [
        {"id": "chat", "messages": msg("hello"), "max_tokens": 7, "temperature": 0},
        {"id": 2, "prompt": "Once upon a time", "max_tokens": 5, "stop": ["zzzz"], "ignore_eos": True},
        "this is not json",
        {"id": "neg", "messages": msg("x"), "max_tokens": -3},
        {"messages": msg("no id")},
        "",
        {"custom_id": "openai-style", "method": "POST", "url": "/v1/chat/completions",
         "body": {"messages": msg("hey"), "max_tokens": 4, "ignore_eos": True}},
        {"id": "chat", "prompt": "duplicate"},
        {"id": "schema", "messages": msg("shape"), "max_tokens": 100, "seed": 1,
         "response_format": {"type": "json_schema", "json_schema": {"schema": {
             "type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
             "additionalProperties": False}}}},
    ])
    out = tmp_path / "out.jsonl"
    r = run_tallow(["batch", str(src), "-o", str(out), "--model", str(synth_model), "--parallel", "3"], home=tmp_path)
    assert r.returncode == 1, r.stderr
    err = r.stderr.decode()
    assert "4 done, 4 failed" in err and "Traceback" not in err
    ok = {rec["id"]: rec for rec in records(out) if "error" not in rec}
    assert set(ok) == {"chat", 2, "openai-style", "schema"}
    assert ok["chat"]["finish_reason"] == "length" and ok["chat"]["usage"]["completion_tokens"] == 7
    assert ok[2]["usage"]["completion_tokens"] == 5 and isinstance(ok[2]["text"], str)
    assert ok["openai-style"]["usage"]["completion_tokens"] == 4
    assert set(ok["chat"]["timings"]) >= {"ttft_ms", "decode_tps", "queue_ms"}
    assert json.loads(ok["schema"]["text"])["ok"] in (True, False)
    errors = {rec["line"]: rec for rec in records(out) if "error" in rec}
    assert set(errors) == {3, 4, 5, 8}
    assert "not valid JSON" in errors[3]["error"] and errors[3]["id"] is None
    assert "'max_tokens' must be between 1 and" in errors[4]["error"] and errors[4]["id"] == "neg"
    assert "needs an 'id'" in errors[5]["error"]
    assert "appears twice" in errors[8]["error"]
    # Run again: everything is already there, nothing is added, and the failures still count.
    before = out.read_text()
    again = run_tallow(["batch", str(src), "-o", str(out), "--model", str(synth_model)], home=tmp_path)
    err = again.stderr.decode()
    assert again.returncode == 1 and "0 done, 0 failed, 4 already in" in err and "4 failed earlier" in err
    assert "4 request(s) failed" in err and "--retry-failed" in err
    assert out.read_text() == before
    # Fix one line and retry the failed ones: their old error records go, only new ones are written.
    lines = src.read_text().splitlines()
    lines[3] = json.dumps({"id": "neg", "messages": msg("x"), "max_tokens": 3})
    src.write_text("\n".join(lines) + "\n")
    retry = run_tallow(["batch", str(src), "-o", str(out), "--model", str(synth_model), "--retry-failed"],
                       home=tmp_path)
    err = retry.stderr.decode()
    assert retry.returncode == 1 and "1 done, 3 failed, 4 already in" in err and "earlier" not in err
    after = records(out)
    assert sorted(rec["line"] for rec in after if "error" in rec) == [3, 5, 8]
    assert {rec["id"] for rec in after if "error" not in rec} == {"chat", 2, "openai-style", "schema", "neg"}


@pytest.mark.slow
def test_killed_run_resumes_without_loss_or_duplicates(synth_model, tmp_path):
    rows = [{"id": f"r{i}", "prompt": f"prompt number {i}", "max_tokens": 400, "temperature": 0} for i in range(40)]
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TALLOW_")}
    env["TALLOW_HOME"] = str(tmp_path)
    proc = subprocess.Popen([sys.executable, "-m", "tallow.cli", "batch", str(src), "-o", str(out), "--model",
                             str(synth_model), "--parallel", "2", "--ctx", "2048"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not (out.exists() and out.read_text().count("\n") >= 3):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    first = records(out)
    assert 3 <= len(first) < 40
    # A record cut short by a kill (as if it died mid-write) is dropped and redone.
    with open(out, "a") as f:
        f.write('{"id": "r39", "text": "half a reco')
    r = run_tallow(["batch", str(src), "-o", str(out), "--model", str(synth_model), "--parallel", "4"],
                   home=tmp_path)
    assert r.returncode == 0, r.stderr
    final = records(out)
    ids = [rec["id"] for rec in final]
    assert sorted(ids) == sorted(row["id"] for row in rows)  # each exactly once
    assert final[: len(first)] == first  # earlier results untouched
    assert all(rec["usage"]["completion_tokens"] > 0 for rec in final)


def test_bad_arguments(synth_model, tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [{"id": 1, "prompt": "x"}])
    missing = run_tallow(["batch", str(tmp_path / "nope.jsonl"), "-o", str(tmp_path / "o.jsonl")], home=tmp_path)
    assert missing.returncode == 2 and b"not a readable file" in missing.stderr
    same = run_tallow(["batch", str(src), "-o", str(src), "--model", str(synth_model)], home=tmp_path)
    assert same.returncode == 2 and b"other than the input" in same.stderr
    assert src.read_text() == '{"id": 1, "prompt": "x"}\n'
    to_dir = run_tallow(["batch", str(src), "-o", str(tmp_path), "--model", str(synth_model)], home=tmp_path)
    assert to_dir.returncode == 2
