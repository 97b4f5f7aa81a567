"""tallow logs --follow against a real server while requests run (each request's record with
its answer's tokens and timings under the id its answer's X-Request-Id header gives; loads and
unloads; the filters), and tallow logs --curl replayed against the same server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from helpers.processes import run_tallow, tallow_env
from helpers.server import Server

pytestmark = pytest.mark.slow  # a server, two followers and a replay


def _follower(home, *args: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "tallow.cli", "logs", "--follow", *args], env=tallow_env(home),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert "following" in proc.stderr.readline()
    return proc


def _stopped(proc: subprocess.Popen) -> list[str]:
    time.sleep(0.6)  # a poll or two: the last records are read
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 130
    return out.splitlines()


def test_follow_shows_requests_with_their_answers_loads_and_errors_and_curl_replays_one(synth_model, tmp_path):
    s = Server(synth_model, tmp_path, "--log-requests", "--api-key", "s3cret-key")
    try:
        everything, failures = _follower(tmp_path, "--json"), _follower(tmp_path, "--errors")
        client = s.client("s3cret-key")
        raw = client.chat.completions.with_raw_response.create(
            model="synthetic.gguf", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        rid = raw.headers["x-request-id"]
        streamed = list(client.chat.completions.create(model="synthetic.gguf", stream=True, max_tokens=3,
                                                       messages=[{"role": "user", "content": "again"}]))
        assert streamed
        status, _, _ = s.raw("/v1/chat/completions", json.dumps({"messages": []}).encode(),
                             {"Authorization": "Bearer s3cret-key", "Content-Type": "application/json"})
        assert status == 400
        unload = {"model": "synthetic.gguf", "prompt": "", "keep_alive": 0}
        s.raw("/api/generate", json.dumps(unload).encode(), {"Authorization": "Bearer s3cret-key"})
        client.chat.completions.create(model="synthetic.gguf", messages=[{"role": "user", "content": "x"}], max_tokens=2)
        records = [json.loads(line) for line in _stopped(everything)]
        shown = _stopped(failures)
    finally:
        s.close()
    by_id = {}
    for r in records:
        by_id.setdefault(r.get("id"), []).append(r)
    http, answer = [next(r for r in by_id[rid] if r["kind"] == k) for k in ("http", "answer")]
    assert http["status"] == 200 and http["path"] == "/v1/chat/completions" and http["auth"] is True
    assert answer["completion_tokens"] == 4 and answer["ttft_ms"] > 0 and answer["model"] == "synthetic.gguf"
    kinds = [r["kind"] for r in records]
    assert kinds.count("http") == 5 and kinds.count("answer") == 3  # the 400 and the unload generate nothing
    assert kinds.index("unload") < kinds.index("load")  # keep_alive 0, then the next request's load
    assert [r["status"] for r in records if r["kind"] == "http"].count(400) == 1
    assert len(shown) == 1 and " 400 " in shown[0] and "/v1/chat/completions" in shown[0]  # --errors
    journal = (tmp_path / "serve-journal.jsonl").read_text()
    assert "s3cret-key" not in journal  # a key is never written

    command = run_tallow(["logs", "--curl", rid], home=tmp_path)
    assert command.returncode == 0, command.stderr.decode()
    line = command.stdout.decode().strip()
    assert line.startswith("curl ") and "$TALLOW_API_KEY" in line and "s3cret" not in line
    s = Server(synth_model, tmp_path, "--api-key", "s3cret-key", "--port", str(http["port"]))
    try:
        replayed = subprocess.run(["bash", "-c", line], capture_output=True, timeout=120,
                                  env={**os.environ, "TALLOW_API_KEY": "s3cret-key"})
    finally:
        s.close()
    answer = json.loads(replayed.stdout)
    assert answer["object"] == "chat.completion" and answer["usage"]["completion_tokens"] == 4


def test_curl_needs_a_kept_body_and_a_known_id(tmp_path):
    from tallow.serve.http.journal import Journal

    Journal(tmp_path / "serve-journal.jsonl", 8080).write({"kind": "http", "id": "abc123", "method": "POST",
                                                          "path": "/v1/completions", "status": 200})
    kept = run_tallow(["logs", "--curl", "abc123"], home=tmp_path)
    assert kept.returncode == 1 and "--log-requests" in kept.stderr.decode()
    unknown = run_tallow(["logs", "--curl", "nope"], home=tmp_path)
    assert unknown.returncode == 1 and "no request 'nope'" in unknown.stderr.decode()
    bad = run_tallow(["logs", "--errors"], home=tmp_path)
    assert bad.returncode == 2 and "--follow" in bad.stderr.decode()


def test_a_full_journal_is_rotated_and_a_request_is_still_found(tmp_path, monkeypatch):
    from tallow.serve.http import journal as j

    monkeypatch.setattr(j, "ROTATE_BYTES", 400)
    log = j.Journal(tmp_path / "serve-journal.jsonl")
    for i in range(12):
        log.write({"kind": "http", "id": f"r{i}", "path": "/v1/completions", "body": {"prompt": "x" * 20}})
    rotated = tmp_path / "serve-journal.jsonl.1"
    line = len((tmp_path / "serve-journal.jsonl").read_text().splitlines()[0]) + 1
    # cut before the write that would start past 400 bytes: never more than that and a line
    assert 400 <= rotated.stat().st_size < 400 + line and (tmp_path / "serve-journal.jsonl").stat().st_size < 400 + line
    newest = json.loads((tmp_path / "serve-journal.jsonl").read_text().splitlines()[-1])["id"]
    assert newest == "r11" and j.find(tmp_path / "serve-journal.jsonl", "r11")["id"] == "r11"
    first_kept = json.loads(rotated.read_text().splitlines()[0])["id"]
    assert j.find(tmp_path / "serve-journal.jsonl", first_kept) is not None
