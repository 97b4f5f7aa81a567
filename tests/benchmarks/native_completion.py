"""llama.cpp's /completion against OpenAI's /v1/completions on one tallow serve: the same
scheduler answers both, so the native route must cost nothing more.

    python tests/benchmarks/native_completion.py [--model PATH] [--rounds 15] [--requests 8] [--tokens 64]

One server (the default model, 2 threads, 4 slots), paired, alternating rounds
(tests/benchmarks/paired.py): each arm of a round sends --requests streamed requests one
after the other to its route, each prompt new (numbered, so no prompt cache serves any),
--tokens tokens each with end of generation banned. Per request: TTFT (to the first chunk
with text) and decode tok/s (tokens after the first over the time after the first); an arm's
figure is its median. Targets: /completion's tok/s >= 0.98x /v1/completions', its TTFT <=
1.02x. Exits 1 when one is missed, 3 when the machine was too noisy to say.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.llamaserver import free_port, sse_chunks, wait_ready  # noqa: E402
from benchmarks.overhead import default_model  # noqa: E402

RATE_TARGET, TTFT_TARGET = 0.98, 1.02


def stream(url: str, path: str, body: dict) -> tuple[float, float]:
    """(TTFT in ms, decode tok/s) of one streamed request; tokens are counted by chunk."""
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    started = time.perf_counter()
    first = last = None
    n = 0
    with urllib.request.urlopen(req, timeout=300) as resp:
        for chunk in sse_chunks(resp):
            text = chunk.get("content") if path == "/completion" else \
                (chunk.get("choices") or [{}])[0].get("text")
            if text:
                now = time.perf_counter()
                first = first or now
                last, n = now, n + 1
    assert first is not None and last is not None and n > 1, (path, n)
    return (first - started) * 1000, (n - 1) / (last - first)


def main() -> int:
    from benchmarks.paired import Comparison, compare_two, exit_code

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    a = ap.parse_args()
    model = a.model or default_model()
    port = free_port()
    env = {**os.environ, "TALLOW_NO_LOG": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "tallow.cli", "serve", str(model), "--port", str(port), "--threads",
                             "2", "--parallel", "4", "--no-cache"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    numbered = iter(range(1_000_000))

    def arm(which: str) -> tuple[float, float]:
        """(median decode tok/s, median TTFT ms) of --requests requests to the arm's route."""
        path = "/completion" if which == "subject" else "/v1/completions"
        got = []
        for _ in range(a.requests):
            n = next(numbered)
            body = {"prompt": f"Request {n}. Write a short story about station {n} and its keeper.", "stream": True,
                    "temperature": 0, "ignore_eos": True, **({"n_predict": a.tokens} if path == "/completion" else
                                                             {"max_tokens": a.tokens})}
            got.append(stream(url, path, body))
        return statistics.median(y for _, y in got), statistics.median(x for x, _ in got)

    try:
        wait_ready(url, proc, "tallow serve")
        print("subject /completion, reference /v1/completions, one server")
        verdicts = compare_two(Comparison("decode", arm, RATE_TARGET, False, a.rounds, unit=" tok/s"),
                               Comparison("TTFT", lambda which: 0.0, TTFT_TARGET, True))
    finally:
        proc.terminate()
        proc.wait(60)
    return exit_code(verdicts)


if __name__ == "__main__":
    raise SystemExit(main())
