"""llama.cpp's /completion against OpenAI's /v1/completions on one tallow serve: the same
scheduler answers both, so the native route must cost nothing more.

    python tests/benchmarks/native_completion.py [--model PATH] [--rounds 15] [--requests 8] [--tokens 64]

One server (the default model, 2 threads, 4 slots). Each round sends --requests streamed
requests one after the other to each route, alternating route by request, each prompt new
(numbered, so no prompt cache serves any), --tokens tokens each with end of generation
banned. Per request: TTFT (to the first chunk with text) and decode tok/s (tokens after the
first over the time after the first). Reported: the medians over all rounds and the spread of
the rounds' medians. Targets: /completion's tok/s >= 0.98x /v1/completions', its TTFT <=
1.02x. Exits 1 when one is missed.
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
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--rounds", type=int, default=15)  # 5 rounds put the decode ratio 0.978x, within noise
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
    try:
        wait_ready(url, proc, "tallow serve")
        results: dict[str, list[tuple[float, float]]] = {"/completion": [], "/v1/completions": []}
        rounds: list[tuple[float, float]] = []
        for r in range(a.rounds):
            mine: dict[str, list[tuple[float, float]]] = {"/completion": [], "/v1/completions": []}
            for i in range(a.requests):
                for k, path in enumerate(("/completion", "/v1/completions") if i % 2 == 0 else
                                         ("/v1/completions", "/completion")):
                    prompt = f"Request {r}-{i}-{k}. Write a short story about station {r * 100 + i} and its keeper."
                    body = {"prompt": prompt, "stream": True, "temperature": 0, "ignore_eos": True}
                    body.update({"n_predict": a.tokens} if path == "/completion" else {"max_tokens": a.tokens})
                    mine[path].append(stream(url, path, body))
            for path, got in mine.items():
                results[path] += got
            med = {p: (statistics.median(x for x, _ in g), statistics.median(y for _, y in g)) for p, g in mine.items()}
            rounds.append((med["/completion"][1] / med["/v1/completions"][1], med["/completion"][0] / med["/v1/completions"][0]))
            print(f"  round {r + 1}: /completion TTFT {med['/completion'][0]:.1f} ms, {med['/completion'][1]:.1f} tok/s; "
                  f"/v1/completions TTFT {med['/v1/completions'][0]:.1f} ms, {med['/v1/completions'][1]:.1f} tok/s")
    finally:
        proc.terminate()
        proc.wait(60)
    native, v1 = results["/completion"], results["/v1/completions"]
    rate = statistics.median(y for _, y in native) / statistics.median(y for _, y in v1)
    ttft = statistics.median(x for x, _ in native) / statistics.median(x for x, _ in v1)
    ok = rate >= RATE_TARGET and ttft <= TTFT_TARGET
    print(f"/completion against /v1/completions, {len(native)} requests each: decode {rate:.3f}x "
          f"(rounds {min(x for x, _ in rounds):.3f}-{max(x for x, _ in rounds):.3f}; target >= {RATE_TARGET}), "
          f"TTFT {ttft:.3f}x (rounds {min(y for _, y in rounds):.3f}-{max(y for _, y in rounds):.3f}; "
          f"target <= {TTFT_TARGET}): {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
