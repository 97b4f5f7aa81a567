"""Recall drafts against llama-server's own n-gram speculation, on recall.py's traces.

Both servers serve the default model dequantized to F32 (memory-bound; recall.py says why),
one slot, 4096 cells, 2 threads, flash attention on: tallow serve with `--draft lookup` (a
prompt lookup, and recall of what earlier requests read and wrote), llama-server with
`--spec-type MODE` at that mode's defaults. Every arm runs a trace on a server started for it,
so both sides begin each trace with an empty memory (llama-server's ngram-mod and
ngram-cache keep theirs across requests, as tallow's recall does).

First each of llama-server's n-gram modes runs each greedy trace once; the fastest on a trace
is the reference there (its best mode, chosen per trace). Then, per trace, paired and
alternating rounds (tests/benchmarks/paired.py): tallow's decode rate over the trace's
requests after its seed ones, against that mode's. Target: >= 1.0x on every trace (issue 53).
Exits 1 when a target is missed, 3 when the machine was too noisy to say.

    python tests/benchmarks/recall_llama.py [--rounds 5] [--modes ngram-mod,ngram-simple]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import urllib.request
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.llamaserver import free_port, wait_ready  # noqa: E402
from benchmarks.paired import Comparison, compare, exit_code  # noqa: E402
from benchmarks.recall import SHELL, TOKENS, TRACES, f32_model  # noqa: E402

MODES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
GREEDY = ("regenerate", "tool loop", "edit loop")
COMMON = ["-c", "4096", "-t", "2", "-tb", "2", "-fa", "on", "-np", "1"]


def body(trace: str, i: int, text: str, model: str) -> dict:
    """One request of a trace, as recall.py's in-process run makes it, in OpenAI's form."""
    spec = TRACES[trace]
    out: dict = {"model": model, "max_tokens": TOKENS, "temperature": 0, "ignore_eos": not spec.tools,
                 "messages": [{"role": "system", "content": f"You are a coding agent in /home/dev/project. Session {i}."},
                              {"role": "user", "content": text}]}
    if spec.tools:
        out["tools"] = [{"type": "function", "function": {"name": "run_shell", "parameters": SHELL,
                                                          "description": "Run a shell command in the project"}}]
        out["tool_choice"] = "required"
    return out


def run_trace(url: str, trace: str) -> float:
    """Decode tok/s over the trace's requests after its seed ones (the server's own timings)."""
    spec, tokens, ms = TRACES[trace], 0, 0.0
    with urllib.request.urlopen(url + "/v1/models", timeout=30) as r:
        model = json.loads(r.read())["data"][0]["id"]  # the name the server gives the file
    for i, text in enumerate(spec.asks):
        req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body(trace, i, text, model)).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            timings = json.loads(r.read())["timings"]
        if i >= spec.seed:
            tokens, ms = tokens + timings["predicted_n"], ms + timings["predicted_ms"]
    return tokens / (ms / 1000)


class Servers:
    """Starts tallow serve or llama-server in one mode for each run of a trace."""

    def __init__(self, model: Path, home: Path, llama_server: Path) -> None:
        from benchmarks.llamabench import tallow_env

        self.model, self.binary = model, llama_server
        self.env = tallow_env(home, TALLOW_MACHINE_CACHE=str(home / "machine.json"))

    @contextmanager
    def started(self, mode: str):
        port = free_port()
        if mode == "tallow":
            cmd = [sys.executable, "-m", "tallow.cli", "serve", str(self.model), "--port", str(port), "--parallel", "1",
                   "--ctx", "4096", "--threads", "2", "--flash-attn", "on", "--draft", "lookup", "--no-cache"]
            env = self.env
        else:
            cmd = [str(self.binary), "-m", str(self.model), "--host", "127.0.0.1", "--port", str(port), *COMMON,
                   "--spec-type", mode, "--no-warmup"]
            env = dict(os.environ)
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_ready(f"http://127.0.0.1:{port}", proc, mode)
            yield f"http://127.0.0.1:{port}"
        finally:
            proc.terminate()
            proc.wait(60)

    def rate(self, mode: str, trace: str) -> float:
        with self.started(mode) as url:
            return run_trace(url, trace)


def best_modes(servers: Servers, modes: list[str]) -> dict[str, str]:
    """llama-server's fastest mode on each greedy trace, from one run of each."""
    best: dict[str, str] = {}
    for trace in GREEDY:
        rates = {}
        for mode in modes:
            try:
                rates[mode] = servers.rate(mode, trace)
            except (RuntimeError, OSError) as exc:  # a mode this build refuses for the model
                print(f"  {trace}: llama-server --spec-type {mode} failed: {exc}")
        best[trace] = max(rates, key=lambda m: rates[m])
        print(f"  {trace}: " + ", ".join(f"{m} {r:.1f}" for m, r in rates.items()) + f" tok/s; best {best[trace]}")
    return best


def main() -> int:
    from benchmarks.llamabench import llama_tool
    from benchmarks.overhead import default_model

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--modes", default=",".join(MODES), help="llama-server's --spec-type modes to try")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        home = Path(scratch)
        model = f32_model(default_model(), home)
        servers = Servers(model, home, llama_tool("llama-server"))
        print(f"target {model.stat().st_size / 1e6:.0f} MB (F32); {TOKENS} tokens a request, greedy")
        best = best_modes(servers, args.modes.split(","))
        verdicts = []
        for trace in GREEDY:
            arms = {"subject": "tallow", "reference": best[trace]}
            verdicts.append(compare(Comparison(f"{trace}: tallow recall / llama-server {best[trace]}",
                                               lambda arm: servers.rate(arms[arm], trace),  # noqa: B023
                                               target=1.0, lower_is_better=False, rounds=args.rounds,
                                               max_rounds=2 * args.rounds, unit=" tok/s")))
    return exit_code(verdicts)


if __name__ == "__main__":
    sys.exit(main())
