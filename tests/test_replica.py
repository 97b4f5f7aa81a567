"""tallow serve as one replica among several: readiness, SIGTERM drain, the balancer's metrics."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest
from helpers.server import Server

pytestmark = pytest.mark.slow  # draining and readiness of a real server

openai = pytest.importorskip("openai")


def get(url: str, path: str) -> tuple[int, dict, str]:
    try:
        with urllib.request.urlopen(url + path, timeout=30) as r:
            return r.status, dict(r.headers), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read().decode()


def test_not_ready_while_the_start_model_loads_then_ready(synth_model, tmp_path):
    env = {**os.environ, "TALLOW_HOME": str(tmp_path), "TALLOW_NO_LOG": "1"}
    env.pop("TALLOW_API_KEY", None)
    # A fixed free port, so that the probes can start before the "serving" line is printed.
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "tallow.cli", "serve", str(synth_model), "--port", str(port)],
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, env=env, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        seen: list[tuple[int, str]] = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                status, headers, body = get(url, "/ready")
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.02)
                continue
            seen.append((status, body))
            if status == 200:
                break
            assert status == 503 and headers.get("retry-after") == "1"
            assert json.loads(body)["ready"] is False
            assert get(url, "/health")[0] == 200  # alive all along
            time.sleep(0.02)
        assert seen and seen[-1][0] == 200 and json.loads(seen[-1][1]) == {"ready": True}
        reasons = {json.loads(b).get("reason", "") for s, b in seen if s == 503}
        assert any(r.startswith(("loading", "starting")) for r in reasons), seen[:3]
        line = ""
        while "serving" not in line:  # the start line still comes, once the model is loaded
            line = proc.stderr.readline()
            assert line, "no start line"
    finally:
        proc.terminate()
        assert proc.wait(60) == 0  # SIGTERM with nothing in flight: drained at once, exit 0


def test_sigterm_drains_four_streams_refuses_new_requests_and_exits_0(synth_model, tmp_path):
    # Four slots of 4,096 tokens: streams of 3,000 tokens last several times longer than the
    # checks below even when the machine is busy (600 tokens were once over before /health).
    s = Server(synth_model, tmp_path, "--parallel", "4", "--ctx", "16384", "--drain-timeout", "120")
    client = s.client()
    results: dict[int, dict] = {}
    started = threading.Barrier(5)

    def stream(i: int) -> None:
        text, finish, first = "", None, True
        for chunk in client.chat.completions.create(
                model="tallow", messages=[{"role": "user", "content": f"count {i}"}], max_tokens=3000, stream=True,
                extra_body={"ignore_eos": True}, temperature=0):
            if first:
                first = False
                started.wait(60)
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                finish = chunk.choices[0].finish_reason or finish
        results[i] = {"text": text, "finish": finish}

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    try:
        started.wait(60)  # all four have their first chunk
        s.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        while json.loads(get(s.url, "/ready")[2]).get("reason") != "draining":
            assert time.monotonic() < deadline, "never started draining"
            time.sleep(0.02)
        status, headers, body = get(s.url, "/health")
        assert status == 200 and json.loads(body)["status"] == "draining"  # alive: not to be killed
        req = urllib.request.Request(s.url + "/v1/chat/completions", method="POST",
                                     data=json.dumps({"messages": [{"role": "user", "content": "new"}]}).encode(),
                                     headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(req, timeout=30)
        assert refused.value.code == 503 and refused.value.headers["Retry-After"] == "1"
        assert json.loads(refused.value.read())["error"]["code"] == "draining"
        metrics = get(s.url, "/metrics")[2]
        assert re.search(r"^tallow_draining 1$", metrics, re.M)
        assert re.search(r"^tallow_requests_refused_draining_total 1$", metrics, re.M)
        assert re.search(r"^tallow_ready 0$", metrics, re.M)
        for t in threads:
            t.join(120)
        assert sorted(results) == [0, 1, 2, 3]
        assert all(r["finish"] == "length" and r["text"] for r in results.values()), results
        assert s.proc.wait(60) == 0
    finally:
        if s.proc.poll() is None:
            s.proc.kill()


def test_metrics_carry_what_a_balancer_needs(synth_model, tmp_path):
    s = Server(synth_model, tmp_path, "--parallel", "2", "--max-queue", "1", "--ctx", "16384")
    try:
        client = s.client()

        def hold(i: int) -> None:
            try:
                client.chat.completions.create(model="tallow", messages=[{"role": "user", "content": f"hold {i}"}],
                                               max_tokens=8000, extra_body={"ignore_eos": True})
            except openai.APIConnectionError:
                pass  # the server is killed at the end

        holders = [threading.Thread(target=hold, args=(i,), daemon=True) for i in range(3)]
        for t, want in zip(holders, ((1, 0), (2, 0), (2, 1))):  # two decoding, one waiting
            t.start()
            deadline = time.monotonic() + 60
            while (s.health()["slots_busy"], s.health()["queue_depth"]) != want:
                assert time.monotonic() < deadline, (want, s.health())
                time.sleep(0.01)
        with pytest.raises(openai.APIStatusError) as busy:  # both slots busy, the queue full: 503
            client.chat.completions.create(model="tallow", messages=[{"role": "user", "content": "fourth"}], max_tokens=2)
        assert busy.value.status_code == 503
        page = get(s.url, "/metrics")[2]
        for name in ("tallow_queue_depth", "tallow_slots_busy", "tallow_slots_total", "tallow_kv_cells_used",
                     "tallow_kv_cells_total", "tallow_requests_rejected_total", "tallow_http_requests_in_flight",
                     "tallow_ready"):
            assert re.search(rf"^{name}(\{{[^}}]*\}})? ", page, re.M), name
        assert re.search(r'^tallow_slots_busy\{model="[^"]+"\} 2$', page, re.M)
        assert re.search(r'^tallow_slots_total\{model="[^"]+"\} 2$', page, re.M)
        assert re.search(r'^tallow_queue_depth\{model="[^"]+"\} 1$', page, re.M)
        assert re.search(r'^tallow_requests_rejected_total\{model="[^"]+"\} 1$', page, re.M)
        assert re.search(r"^tallow_http_requests_in_flight 3$", page, re.M)
        used = int(re.search(r'^tallow_kv_cells_used\{model="[^"]+"\} (\d+)$', page, re.M).group(1))
        assert used > 0
    finally:
        s.proc.kill()
        s.proc.wait(30)
