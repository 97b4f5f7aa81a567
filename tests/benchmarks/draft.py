"""Speculative decoding with a draft model: the default model at F32 (dequantized from the
stored Q4_1: memory-bound, as the 1-8B models people run are, where drafting can pay; at
F16 a decode is too cheap beside the Q4_1's) drafted for by the stored Q4_1 itself, in one
run, each comparison in paired, alternating rounds (tests/benchmarks/paired.py):

- one stream, greedy, 160 tokens: a prompt the draft predicts well (counting) with the draft
  against without it (target >= 1.3x), and one it predicts less well (a story; >= 0.97x:
  where drafts do not pay, the cost rule must stop drafting);
- the same counting prompt against llama.cpp's own speculative decoding with the same pair
  (llama-server -md with its default draft settings, built from the vendored source; tallow
  >= 1.0x of its decode speed);
- 8 concurrent streams of 64 tokens: aggregate with drafting >= 0.97x of without.

    python tests/benchmarks/draft.py [--rounds 5] [--cases counting,story,llama-server,streams]

Each figure comes with the acceptance and the mean draft length. Both sides use 2 threads,
flash attention on and no weight repacking; every server binds loopback only. Exits 1 when a
target is missed, 3 when the machine was too noisy to say.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.llamaserver import free_port, round_of, wait_ready  # noqa: E402
from benchmarks.paired import Comparison, compare, exit_code  # noqa: E402

EASY = "Count from 1 to 200, separated by commas."
HARD = "Write a short story about a lighthouse keeper who finds a message in a bottle."
TOKENS = 160
TARGET_TYPE = "F32"  # memory-bound, as the 1-8B models people run are: where drafting can pay


def ask(url: str, prompt: str) -> dict:
    """One greedy chat answer of TOKENS tokens; the server's own timings and usage."""
    body = json.dumps({"model": "tallow", "messages": [{"role": "user", "content": prompt}], "max_tokens": TOKENS,
                       "temperature": 0, "ignore_eos": True}).encode()
    req = urllib.request.Request(url + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def decode_speed(answer: dict) -> float:
    t = answer["timings"]
    return t["decode_tps"] if "decode_tps" in t else t["predicted_per_second"]


def drafted(answer: dict) -> tuple[float, float]:
    """(acceptance, mean draft length) of one of tallow's answers (0, 0 when it did not draft)."""
    u = answer["usage"]
    if u.get("draft_tokens"):
        return u["accepted_tokens"] / u["draft_tokens"], u["draft_tokens"] / u["draft_steps"]
    return 0.0, 0.0


def make_pair(home: Path, env: dict) -> tuple[Path, Path]:
    """(the F32 target, the Q4_1 draft): files in a home of the benchmark's own."""
    from helpers.processes import shared_home

    from tallow.models.resolve import locate
    from tallow.models.store import Store

    blob = locate("smollm2:135m", Store(shared_home() / "models")).path
    for args in (["import", str(blob), "--name", "smol:q41"],
                 ["quantize", "smol:q41", "--type", TARGET_TYPE, "--allow-requantize", "--name", "smol:target"]):
        subprocess.run([sys.executable, "-m", "tallow.cli", *args], env=env, check=True, capture_output=True)
    store = Store(home / "models")
    return locate("smol:target", store).path, locate("smol:q41", store).path


def start(cmd: list[str], env: dict) -> subprocess.Popen:
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main() -> int:
    from benchmarks.llamabench import llama_tool, tallow_env

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cases", default=",".join(CASES), help=f"which comparisons, of {','.join(CASES)}")
    args = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="tallow-draft-bench-"))
    env = tallow_env(home, TALLOW_CPU_REPACK="off")
    target, draft = make_pair(home, env)
    print(f"target {target.stat().st_size / 1e6:.0f} MB ({TARGET_TYPE}), draft {draft.stat().st_size / 1e6:.0f} MB (Q4_1)")
    binary = llama_tool("llama-server")
    ports = [free_port() for _ in range(3)]
    serve = [sys.executable, "-m", "tallow.cli", "serve", str(target), "--parallel", "8", "--ctx", "4096", "--threads",
             "2", "--flash-attn", "on", "--no-cache"]
    procs = [start([*serve, "--port", str(ports[0])], env),
             start([*serve, "--port", str(ports[1]), "--draft", str(draft)], env),
             start([str(binary), "-m", str(target), "-md", str(draft), "--host", "127.0.0.1", "--port", str(ports[2]),
                    "-np", "1", "-c", "4096", "-t", "2", "-tb", "2", "-fa", "on", "--no-repack"], {**os.environ, "LLAMA_ARG_REPACK": "0"})]
    plain, spec, theirs = (f"http://127.0.0.1:{p}" for p in ports)
    try:
        for url, proc, what in zip((plain, spec, theirs), procs, ("tallow serve", "tallow serve --draft", "llama-server")):
            wait_ready(url, proc, what)
        verdicts = compared(plain, spec, theirs, args.rounds, set(args.cases.split(",")))
    finally:
        for p in procs:
            p.terminate()
            p.wait(30)
    return exit_code(verdicts)


CASES = ("counting", "story", "llama-server", "streams")


def compared(plain: str, spec: str, theirs: str, rounds: int, cases: set[str]) -> list:
    """The comparisons asked for (all four by default), each with the drafts' acceptance and
    length beside it."""
    drafts: dict[str, list[tuple[float, float]]] = {}

    def speed(name: str, prompt: str, subject: str, reference: str):
        def measure(arm: str) -> float:
            answer = ask(subject if arm == "subject" else reference, prompt)
            if arm == "subject":
                drafts.setdefault(name, []).append(drafted(answer))
            return decode_speed(answer)
        return measure

    verdicts = []
    for case, name, prompt, subject, reference, target in (
            ("counting", "one stream, predictable: with/without drafts", EASY, spec, plain, 1.3),
            ("story", "one stream, a story: with/without drafts", HARD, spec, plain, 0.97),
            ("llama-server", "predictable: tallow/llama-server -md", EASY, spec, theirs, 1.0)):
        if case not in cases:
            continue
        verdicts.append(compare(Comparison(name, speed(name, prompt, subject, reference), target, False, rounds,
                                           unit=" tok/s")))
        got = drafts[name]
        print(f"  acceptance {statistics.median(a for a, _ in got):.0%}, mean draft length "
              f"{statistics.median(n for _, n in got):.1f}")
    if "streams" in cases:
        verdicts.append(compare(Comparison("8 streams, aggregate: with/without drafts",
                                           lambda arm: round_of(spec if arm == "subject" else plain, 8)[0], 0.97,
                                           False, rounds, unit=" tok/s")))
    return verdicts


if __name__ == "__main__":
    sys.exit(main())
