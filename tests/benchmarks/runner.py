"""What the runner process costs: tallow serve (the HTTP front relaying to a runner process
over its Unix socket) against the same model served in one process (the runner itself on a
loopback port: the single-model app over the scheduler, as serve was before runners), same
model, same settings, in paired, alternating rounds (tests/benchmarks/paired.py), each arm
of a round a fresh server.

    python tests/benchmarks/runner.py [--model PATH] [--rounds 6] [--tokens 256]

Measured on the client, from the stream:
- one streamed request (a ~400-token prompt no cache holds): TTFT and decode tok/s;
- the same with the prompt cached, where TTFT is mostly the per-request overhead (reported);
- 8 concurrent streams: the aggregate tok/s while all 8 decode;
- the CPU time the front spends per relayed token;
- the first request to a model not loaded (its runner starts) against one resident.

Targets: one stream's decode tok/s >= 0.97x in-process and its TTFT <= 1/0.97x; the
aggregate at 8 streams >= 0.95x. Exits 1 when one is missed, 3 when the machine was too
noisy to say.
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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.llamaserver import free_port, wait_ready  # noqa: E402
from benchmarks.overhead import default_model  # noqa: E402

SINGLE, AGGREGATE = 0.97, 0.95
SINGLES = 5  # one-stream requests per server start (their median)
PROMPT = "Summarise this report. " + " ".join(f"Station {i} measured {i * 7 % 13} mm of rain." for i in range(45))


def start(kind: str, model: Path, port: int, env: dict) -> subprocess.Popen:
    conf = {"parallel": 8, "ctx": 8 * 2048, "max_tokens": 4096}
    if kind == "in-process":
        argv = ["runner", str(model), "--port", str(port), "--config", json.dumps(conf)]
    else:
        argv = ["serve", str(model), "--port", str(port), "--parallel", "8", "--ctx", str(8 * 2048)]
    proc = subprocess.Popen([sys.executable, "-m", "tallow.cli", *argv], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    wait_ready(f"http://127.0.0.1:{port}", proc, kind)
    return proc


def stream(url: str, model: str, tokens: int, salt: str = "") -> tuple[float, float, list[float]]:
    """(TTFT s, decode tok/s, each token's arrival time) of one streamed completion; a salt
    in front makes a prompt no cache holds."""
    body = {"model": model, "messages": [{"role": "user", "content": salt + PROMPT}], "max_tokens": tokens,
            "temperature": 0, "ignore_eos": True, "stream": True}
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    started = time.perf_counter()
    times = []
    with urllib.request.urlopen(req, timeout=600) as r:
        for raw in r:
            if raw.startswith(b"data: {"):
                choices = json.loads(raw[6:]).get("choices") or [{}]
                if choices[0].get("delta", {}).get("content"):
                    times.append(time.perf_counter())
    ttft = times[0] - started
    tps = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else 0.0
    return ttft, tps, times


def front_cpu(proc: subprocess.Popen) -> float:
    """CPU seconds the serve process itself (the front, not its runner) has used."""
    import psutil

    t = psutil.Process(proc.pid).cpu_times()
    return t.user + t.system


def measure(url: str, model: str, tokens: int, rep: int, proc: subprocess.Popen) -> dict[str, float]:
    stream(url, model, 8)  # warm: the prompt cache holds the prompt for the other runs alike
    singles = [stream(url, model, tokens, f"Run {rep}.{i}. ") for i in range(SINGLES)]
    cached = [stream(url, model, 2)[0] for _ in range(SINGLES)]
    cpu = front_cpu(proc)
    with ThreadPoolExecutor(8) as pool:
        runs = list(pool.map(lambda _: stream(url, model, tokens), range(8)))  # the cached prompt: they start together
    cpu = front_cpu(proc) - cpu
    # decoding together: from the last stream's first token to the first stream's last one
    start, end = max(r[2][0] for r in runs), min(r[2][-1] for r in runs)
    if end <= start:
        sys.exit("the 8 streams never decoded together: give more --tokens")
    together = sum(sum(1 for t in r[2] if start < t <= end) for r in runs)
    return {"ttft": statistics.median(r[0] for r in singles), "tps": statistics.median(r[1] for r in singles),
            "cached_ttft": statistics.median(cached), "aggregate": together / (end - start),
            "cpu_per_token": cpu / sum(len(r[2]) for r in runs)}


def cold_vs_resident(url: str, model: str) -> tuple[float, float]:
    def generate(keep_alive=None) -> float:
        body = {"model": model, "prompt": "hi", "options": {"num_predict": 1}, "stream": False}
        if keep_alive is not None:
            body = {"model": model, "keep_alive": keep_alive}
        started = time.perf_counter()
        urllib.request.urlopen(urllib.request.Request(url + "/api/generate", data=json.dumps(body).encode()),
                               timeout=600).read()
        return time.perf_counter() - started

    resident = min(generate() for _ in range(3))
    generate(keep_alive=0)
    return generate(), resident


def main() -> int:
    from benchmarks.paired import Comparison, compare_many, exit_code

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=256)
    args = ap.parse_args()
    model = args.model or default_model()
    env = {**os.environ, "TALLOW_NO_LOG": "1"}
    seen: dict[str, list[dict[str, float]]] = {"reference": [], "subject": []}
    cold = []

    def arm(which: str) -> tuple[float, float, float]:
        port = free_port()
        proc = start("runner" if which == "subject" else "in-process", model, port, env)
        try:
            url = f"http://127.0.0.1:{port}"
            got = measure(url, model.name, args.tokens, len(seen[which]), proc)
            if which == "subject" and not cold:
                cold.append(cold_vs_resident(url, model.name))
        finally:
            proc.terminate()
            proc.wait(60)
        seen[which].append(got)
        return got["tps"], got["ttft"], got["aggregate"]

    print(f"model {model.name}, {args.tokens} tokens per stream; subject: serve's front and runner, "
          "reference: the runner alone in one process")
    verdicts = compare_many(Comparison("decode tok/s, one stream", arm, SINGLE, False, args.rounds, unit=" tok/s"),
                            [Comparison("TTFT, one stream", lambda which: 0.0, 1 / SINGLE, True),
                             Comparison("aggregate tok/s, 8 streams", lambda which: 0.0, AGGREGATE, False)])
    a, b = ({m: statistics.median(r[m] for r in seen[k]) for m in ("cached_ttft", "cpu_per_token")}
            for k in ("reference", "subject"))
    print(f"TTFT with the whole prompt cached: {a['cached_ttft'] * 1000:.1f} ms in-process, "
          f"{b['cached_ttft'] * 1000:.1f} ms through the runner: the hop costs "
          f"{(b['cached_ttft'] - a['cached_ttft']) * 1000:.1f} ms a request (reported, no target)")
    print(f"CPU the front (the serve process, not its runner) spends per streamed token, 8 streams: "
          f"{b['cpu_per_token'] * 1e6:.0f} us (reported, no target)")
    if cold:
        print(f"first request, model not loaded: {cold[0][0] * 1000:.0f} ms; resident: {cold[0][1] * 1000:.0f} ms "
              f"({cold[0][0] / cold[0][1]:.1f}x: the runner's start and load)")
    return exit_code(verdicts)


if __name__ == "__main__":
    sys.exit(main())
