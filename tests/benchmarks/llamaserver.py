"""tallow serve against llama.cpp's own llama-server, built from the same vendored llama.cpp:
the same model, as many slots as streams, N concurrent streamed chat requests of 64 tokens
(8 and 32 by default), in paired, alternating rounds between the two servers
(tests/benchmarks/paired.py; 2 threads, weight repacking off on both).

    python tests/benchmarks/llamaserver.py [--rounds 7] [--streams 8,32] [--model PATH]

For each N: the aggregate output tok/s (all tokens / wall time of the round) and the median
TTFT of the round, each as tallow / llama-server with its spread; targets: aggregate >= 1.0x,
TTFT <= 1.0x (issue 53). Exits 1 when one is missed, 3 when the machine was too noisy to
say. Both servers bind loopback only.
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

from benchmarks.paired import Comparison, Verdict, compare_two, exit_code  # noqa: E402

TOKENS, CELLS = 64, 512  # cells of context per slot
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


def round_of(url: str, streams: int) -> tuple[float, float]:
    """(aggregate output tok/s, median TTFT ms) of `streams` concurrent requests."""
    ttfts: list[float] = []
    threads = [threading.Thread(target=one, args=(url, QUESTIONS[i % len(QUESTIONS)] + f" ({i})", ttfts))
               for i in range(streams)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    assert len(ttfts) == streams, "a request failed"
    return streams * TOKENS / wall, statistics.median(ttfts)


def servers(model: Path, streams: int, home: Path, args) -> tuple[dict[str, str], list[subprocess.Popen]]:
    """tallow serve (subject) and llama-server (reference) with a slot per stream, ready."""
    from benchmarks.llamabench import llama_tool, tallow_env

    binary = llama_tool("llama-server")
    p1, p2, ctx = free_port(), free_port(), str(streams * CELLS)
    env = tallow_env(home, TALLOW_MACHINE_CACHE=str(home / "machine.json"), TALLOW_CPU_REPACK="off")
    ours = subprocess.Popen([sys.executable, "-m", "tallow.cli", "serve", str(model), "--port", str(p1), "--parallel",
                             str(streams), "--ctx", ctx, "--threads", "2", "--no-cache", *args.tallow_args.split()],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    theirs = subprocess.Popen([str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(p2), "-np",
                               str(streams), "-c", ctx, "-t", "2", "-tb", "2", "--no-repack", "--no-warmup",
                               *args.llama_args.split()], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env={**os.environ, "LLAMA_ARG_REPACK": "0"})
    urls = {"subject": f"http://127.0.0.1:{p1}", "reference": f"http://127.0.0.1:{p2}"}
    wait_ready(urls["subject"], ours, "tallow serve")
    wait_ready(urls["reference"], theirs, "llama-server")
    return urls, [ours, theirs]


def at(streams: int, urls: dict[str, str], rounds: int) -> list[Verdict]:
    """The aggregate and the median TTFT at one stream count, from the same rounds."""
    return compare_two(
        Comparison(f"{streams} streams, aggregate", lambda arm: round_of(urls[arm], streams), target=1.0,
                   lower_is_better=False, rounds=rounds, unit=" tok/s"),
        Comparison(f"{streams} streams, median TTFT", lambda arm: 0.0, target=1.0, lower_is_better=True))


def main() -> int:
    from helpers.processes import shared_home

    from tallow.models.resolve import locate
    from tallow.models.store import Store

    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--streams", default="8,32")
    ap.add_argument("--model", default=None)
    ap.add_argument("--tallow-args", default="", help="more options for tallow serve (e.g. '--flash-attn on')")
    ap.add_argument("--llama-args", default="", help="more options for llama-server")
    args = ap.parse_args()
    home = shared_home()
    # the default model by name: the shared store's blobs may hold others written by tests
    model = Path(args.model) if args.model else locate("smollm2:135m", Store(home / "models")).path
    verdicts: list[Verdict] = []
    for streams in map(int, args.streams.split(",")):
        urls, procs = servers(model, streams, home, args)
        try:
            verdicts += at(streams, urls, args.rounds)
        finally:
            for p in procs:
                p.terminate()
                p.wait(30)
    for v in verdicts:
        print(v.line())
    return exit_code(verdicts)


if __name__ == "__main__":
    sys.exit(main())
