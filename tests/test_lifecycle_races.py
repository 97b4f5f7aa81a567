"""Lifecycle races (the class of CVE-2026-43631's unload use-after-free): while clients stream
answers from a model, it is unloaded (Ollama's keep_alive 0, which tallow stop sends), re-created
under the same name (Ollama's create, which stops its runner) and listed, hundreds of times in
a loop. Nothing crashes, no runner dies unasked, and every request is answered whole or
refused in its API's shape; an unload waits for the answers in flight."""

from __future__ import annotations

import json
import threading
import time

import pytest
from helpers.processes import run_tallow
from helpers.server import Server

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.slow  # hundreds of loads and unloads

RACES = 3000  # racer rounds at most (an unload, a re-create or a listing each), until the clients are done
ASKS = 40  # requests per client


def test_unload_recreate_and_list_race_with_streaming_answers(synth_model, tmp_path):
    imported = run_tallow(["import", str(synth_model), "--name", "base"], home=tmp_path)
    assert imported.returncode == 0, imported.stderr.decode()
    s = Server(None, tmp_path, "--parallel", "4", "--keep-alive", "5m")
    outcomes: list[str] = []
    problems: list[str] = []
    done = threading.Event()
    try:
        status, _, body = s.raw("/api/create", json.dumps({"model": "racer", "from": "base",
                                                            "stream": False}).encode())
        assert status == 200, body
        client = s.client()

        def ask(i: int) -> None:
            for n in range(ASKS):
                try:
                    finish = None
                    for chunk in client.chat.completions.create(
                            model="racer", messages=[{"role": "user", "content": f"client {i} turn {n}"}],
                            max_tokens=12, stream=True, extra_body={"ignore_eos": True}):
                        if chunk.choices and chunk.choices[0].finish_reason:
                            finish = chunk.choices[0].finish_reason
                    (outcomes if finish == "length" else problems).append(f"answered {finish}")
                except openai.APIStatusError as exc:  # refused in the API's shape
                    (outcomes if exc.status_code in (429, 503) else problems).append(f"{exc.status_code} {exc}")
                except Exception as exc:  # noqa: BLE001 - a reset connection, a torn stream: what must not happen
                    problems.append(f"{type(exc).__name__}: {exc}")
                time.sleep(0.03 * ((n + i) % 3))  # now and then all clients pause: an unload can land

        def race() -> None:
            for n in range(RACES):
                if done.is_set():
                    return
                if n % 3 == 0:
                    s.raw("/api/generate", json.dumps({"model": "racer", "keep_alive": 0}).encode())
                elif n % 3 == 1:
                    code, _, answer = s.raw("/api/create", json.dumps({"model": "racer", "from": "base",
                                                                       "stream": False}).encode())
                    if code != 200:
                        problems.append(f"create {code} {answer}")
                else:
                    s.raw("/api/ps")
                time.sleep(0.005)

        clients = [threading.Thread(target=ask, args=(i,)) for i in range(3)]
        racer = threading.Thread(target=race)
        for t in (*clients, racer):
            t.start()
        for t in clients:
            t.join(600)
        done.set()
        racer.join(120)
        assert not problems, problems[:5]
        assert len(outcomes) == 3 * ASKS and outcomes.count("answered length") >= ASKS  # most were answered
        metrics = s.raw("/metrics")[2]
        assert "tallow_runner_crashes_total 0" in metrics
        journal = [json.loads(line) for line in (tmp_path / "serve-journal.jsonl").read_text().splitlines()]
        loads = sum(r["kind"] == "load" for r in journal)
        assert loads >= 10 and sum(r["kind"] == "unload" for r in journal) >= loads - 1, loads  # the races ran
        assert s.proc.poll() is None and s.health()["status"] == "ok"
    finally:
        done.set()
        s.close()
