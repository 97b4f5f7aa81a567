"""tallow serve against llama.cpp's own llama-server, built from the same vendored llama.cpp:
the same model, 8 slots, 8 concurrent streamed chat requests of 64 tokens, rounds alternating
between the two servers in one run (2 threads, weight repacking off on both).

    python tests/benchmarks/llamaserver.py [--rounds 12] [--model PATH]

Prints each side's aggregate output tok/s (all tokens / wall time of the round) and median
TTFT, and the ratios; exits non-zero unless tallow's aggregate >= 1.0x llama-server's and its
median TTFT <= 1.0x (the targets of issue 16). Both servers bind loopback only.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SLOTS, TOKENS, CTX = 8, 64, 8 * 512
QUESTIONS = ["Why is the sky blue?", "Name three rivers in Europe.", "What is a prime number?",
             "How do bees make honey?", "Describe a lighthouse.", "What is rust on iron?",
             "Why do cats purr?", "How far is the moon?"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, proc: subprocess.Popen, what: str) -> None:
    """Until the server is ready: tallow serve's /ready (its /health answers while it loads),
    or /health for llama-server, which has no /ready and answers 503 there while loading."""
    deadline = time.monotonic() + 300
    path = "/ready"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + path, timeout=2) as r:
                if r.status == 200:
                    return
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                path = "/health"
        except OSError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{what} did not become ready")


def sse_chunks(resp):
    """The JSON chunks of a server-sent event stream, up to its [DONE]."""
    for raw in resp:
        line = raw.decode().strip()
        if line.startswith("data: ") and line != "data: [DONE]":
            yield json.loads(line[6:])


def one(url: str, question: str, out: list) -> None:
    body = json.dumps({"model": "tallow", "messages": [{"role": "user", "content": question}], "max_tokens": TOKENS,
                       "temperature": 0, "stream": True, "ignore_eos": True}).encode()
    req = urllib.request.Request(url + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"})
    started = time.perf_counter()
    first = None
    with urllib.request.urlopen(req, timeout=300) as r:
        for chunk in sse_chunks(r):
            if first is None and any(c.get("delta", {}).get("content") for c in chunk.get("choices", [])):
                first = time.perf_counter()
    out.append((first - started) * 1000)


def round_of(url: str) -> tuple[float, float]:
    """(aggregate output tok/s, median TTFT ms) of SLOTS concurrent requests."""
    ttfts: list[float] = []
    threads = [threading.Thread(target=one, args=(url, q, ttfts)) for q in QUESTIONS[:SLOTS]]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    assert len(ttfts) == SLOTS, "a request failed"
    return SLOTS * TOKENS / wall, statistics.median(ttfts)


def main() -> int:
    from helpers.processes import shared_home

    from benchmarks.llamabench import llama_tool, tallow_env
    from tallow.models.resolve import locate
    from tallow.models.store import Store

    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--model", default=None)
    ap.add_argument("--tallow-args", default="", help="more options for tallow serve (e.g. '--flash-attn on')")
    ap.add_argument("--llama-args", default="", help="more options for llama-server")
    args = ap.parse_args()
    home = shared_home()
    # the default model by name: the shared store's blobs may hold others written by tests
    model = Path(args.model) if args.model else locate("smollm2:135m", Store(home / "models")).path
    binary = llama_tool("llama-server")
    p1, p2 = free_port(), free_port()
    env = tallow_env(home, TALLOW_MACHINE_CACHE=str(home / "machine.json"), TALLOW_CPU_REPACK="off")
    ours = subprocess.Popen([sys.executable, "-m", "tallow.cli", "serve", str(model), "--port", str(p1), "--parallel",
                             str(SLOTS), "--ctx", str(CTX), "--threads", "2", "--no-cache", *args.tallow_args.split()], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    theirs = subprocess.Popen([str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(p2), "-np", str(SLOTS),
                               "-c", str(CTX), "-t", "2", "-tb", "2", "--no-repack", "--no-warmup", *args.llama_args.split()],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env={**os.environ, "LLAMA_ARG_REPACK": "0"})
    try:
        u1, u2 = f"http://127.0.0.1:{p1}", f"http://127.0.0.1:{p2}"
        wait_ready(u1, ours, "tallow serve")
        wait_ready(u2, theirs, "llama-server")
        round_of(u1), round_of(u2)  # warm-up, not counted
        a, b = [], []
        for _ in range(args.rounds):
            a.append(round_of(u1))
            b.append(round_of(u2))
    finally:
        for p in (ours, theirs):
            p.terminate()
            p.wait(30)
    agg_a, agg_b = statistics.median(x[0] for x in a), statistics.median(x[0] for x in b)
    ttft_a, ttft_b = statistics.median(x[1] for x in a), statistics.median(x[1] for x in b)
    print(f"{'':14} {'aggregate tok/s':>16} {'median TTFT ms':>15}")
    print(f"{'tallow serve':14} {agg_a:>16.1f} {ttft_a:>15.0f}")
    print(f"{'llama-server':14} {agg_b:>16.1f} {ttft_b:>15.0f}")
    print(f"{'ratio':14} {agg_a / agg_b:>15.2f}x {ttft_a / ttft_b:>14.2f}x   (targets: >= 1.00x, <= 1.00x)")
    print("rounds (tok/s, TTFT ms): tallow " + ", ".join(f"{x:.0f}/{y:.0f}" for x, y in a)
          + "; llama-server " + ", ".join(f"{x:.0f}/{y:.0f}" for x, y in b))
    if args.rounds >= 4:  # the spread, to set against the gap between the medians
        for name, side in (("tallow", a), ("llama-server", b)):
            q = statistics.quantiles([y for _, y in side], n=4)
            print(f"{name} median TTFT quartiles {q[0]:.0f} to {q[2]:.0f} ms")
    return 0 if agg_a / agg_b >= 1.0 and ttft_a / ttft_b <= 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
