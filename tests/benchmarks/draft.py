"""Speculative decoding with a draft model: the default model at F16 (dequantized from the
stored Q4_1, so the same answers at a target's size) drafted for by the stored Q4_1 itself,
in one run, rounds alternating:

- one stream, greedy, 160 tokens: a prompt the draft predicts well (counting) with the draft
  against without it (target >= 1.3x), and one it predicts less well (a story; >= 0.95x);
- the same counting prompt against llama.cpp's own speculative decoding with the same pair
  (llama-server -md with its default draft settings, built from the vendored source; tallow
  >= 1.0x of its decode speed);
- 8 concurrent streams of 64 tokens: aggregate with drafting >= 0.95x of without.

    python tests/benchmarks/draft.py [--rounds 5]

Each figure comes with the acceptance and the mean draft length. Both sides use 2 threads,
flash attention on and no weight repacking; every server binds loopback only. Exits 1 when a
target is missed.
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

EASY = "Count from 1 to 200, separated by commas."
HARD = "Write a short story about a lighthouse keeper who finds a message in a bottle."
TOKENS = 160


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


def native_acceptance(answer: dict) -> float | None:
    """llama-server's acceptance, where its timings report the drafts (None: they do not)."""
    t = answer["timings"]
    return t["draft_n_accepted"] / t["draft_n"] if t.get("draft_n") else None


def make_pair(home: Path, env: dict) -> tuple[Path, Path]:
    """(the F16 target, the Q4_1 draft): files in a home of the benchmark's own."""
    from helpers.processes import shared_home

    from tallow.models.resolve import locate
    from tallow.models.store import Store

    blob = locate("smollm2:135m", Store(shared_home() / "models")).path
    for args in (["import", str(blob), "--name", "smol:q41"],
                 ["quantize", "smol:q41", "--type", "F16", "--allow-requantize", "--name", "smol:f16"]):
        subprocess.run([sys.executable, "-m", "tallow.cli", *args], env=env, check=True, capture_output=True)
    store = Store(home / "models")
    return locate("smol:f16", store).path, locate("smol:q41", store).path


def start(cmd: list[str], env: dict) -> subprocess.Popen:
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main() -> int:
    from benchmarks.llamabench import llama_tool, tallow_env

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="tallow-draft-bench-"))
    env = tallow_env(home, TALLOW_CPU_REPACK="off")
    target, draft = make_pair(home, env)
    print(f"target {target.stat().st_size / 1e6:.0f} MB (F16), draft {draft.stat().st_size / 1e6:.0f} MB (Q4_1)")
    binary = llama_tool("llama-server")
    ports = [free_port() for _ in range(3)]
    serve = [sys.executable, "-m", "tallow.cli", "serve", str(target), "--parallel", "8", "--ctx", "4096", "--threads",
             "2", "--flash-attn", "on", "--no-cache"]
    procs = [start([*serve, "--port", str(ports[0])], env),
             start([*serve, "--port", str(ports[1]), "--draft", str(draft)], env),
             start([str(binary), "-m", str(target), "-md", str(draft), "--host", "127.0.0.1", "--port", str(ports[2]),
                    "-np", "1", "-c", "4096", "-t", "2", "-tb", "2", "-fa", "on", "--no-repack"], {**os.environ, "LLAMA_ARG_REPACK": "0"})]
    plain, spec, theirs = (f"http://127.0.0.1:{p}" for p in ports)
    rows: dict[str, list] = {k: [] for k in ("easy", "hard", "native", "streams")}
    try:
        for url, proc, what in zip((plain, spec, theirs), procs, ("tallow serve", "tallow serve --draft", "llama-server")):
            wait_ready(url, proc, what)
        for url in (plain, spec, theirs):
            ask(url, EASY)  # warm-up
        for _ in range(args.rounds):
            for key, prompt in (("easy", EASY), ("hard", HARD)):
                base, with_draft = ask(plain, prompt), ask(spec, prompt)
                rows[key].append((decode_speed(with_draft) / decode_speed(base), *drafted(with_draft)))
            ours, native = ask(spec, EASY), ask(theirs, EASY)
            rows["native"].append((decode_speed(ours) / decode_speed(native), *drafted(ours), native_acceptance(native)))
            off, on = round_of(plain)[0], round_of(spec)[0]
            rows["streams"].append((on / off, off, on))
    finally:
        for p in procs:
            p.terminate()
            p.wait(30)
    return report(rows)


def report(rows: dict[str, list]) -> int:
    ok = True
    for key, what, target in (("easy", "one stream, predictable: with/without", 1.3),
                              ("hard", "one stream, a story: with/without", 0.95),
                              ("native", "predictable: tallow/llama-server -md", 1.0),
                              ("streams", "8 streams, aggregate: with/without", 0.95)):
        ratios = [r[0] for r in rows[key]]
        med = statistics.median(ratios)
        ok &= med >= target
        detail = ""
        if key in ("easy", "hard", "native"):
            detail = (f"; acceptance {statistics.median(r[1] for r in rows[key]):.0%}, mean draft length "
                      f"{statistics.median(r[2] for r in rows[key]):.1f}")
        if key == "native":
            theirs = [r[3] for r in rows[key] if r[3] is not None]
            detail += f"; llama-server's acceptance {statistics.median(theirs):.0%}" if theirs else \
                "; llama-server does not report its acceptance on this route"
        if key == "streams":
            detail = f"; {statistics.median(r[1] for r in rows[key]):.1f} vs {statistics.median(r[2] for r in rows[key]):.1f} tok/s"
        print(f"{what}: {med:.3f}x (rounds {min(ratios):.2f}-{max(ratios):.2f}; target >= {target}){detail}")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
