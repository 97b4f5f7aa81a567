"""tallow batch against servers: what the client costs, and one batch file over 1, 2 and 3
replicas on this machine.

    python tests/benchmarks/fleet.py [--model PATH] [--requests 32] [--tokens 32] [--rounds 5]

1. The client's own cost: the same batch file run in-process (`tallow batch`, the scheduler in
   the command's own process) and against one `tallow serve` replica with the same settings
   (`tallow batch --endpoint`), in paired, alternating rounds (tests/benchmarks/paired.py);
   the aggregate output tok/s each run reports (from its first request to its last answer;
   model loading excluded on both sides). Target: the endpoint run >= 0.95x the in-process
   one. Exits 1 when missed, 3 when the machine was too noisy to say.
2. The same file over 1, 2 and 3 replicas (`--endpoint` once per replica): reported, not a
   target: on a 2-core machine the replicas share the cores, so this shows what spreading
   costs, not how it scales.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.llamaserver import free_port, wait_ready  # noqa: E402
from benchmarks.overhead import default_model  # noqa: E402
from benchmarks.paired import Comparison, compare, exit_code  # noqa: E402

TARGET = 0.95
PARALLEL = 4
RATE = re.compile(r"(\d+) tokens at ([\d.]+) tok/s")


def write_batch(path: Path, n: int, tokens: int) -> None:
    with open(path, "w") as f:
        for i in range(n):
            text = f"Request {i}. Describe the weather at station {i} in a few sentences. " * 6
            f.write(json.dumps({"id": i, "messages": [{"role": "user", "content": text}], "max_tokens": tokens,
                                "temperature": 0, "ignore_eos": True}) + "\n")


def batch(args: list[str], env: dict, out: Path) -> float:
    """Output tok/s the batch reports; the output file is removed first (a fresh run)."""
    out.unlink(missing_ok=True)
    got = subprocess.run([sys.executable, "-m", "tallow.cli", "batch", *args, "-o", str(out)], env=env,
                         capture_output=True, text=True, timeout=3600)
    if got.returncode != 0:
        raise SystemExit(f"tallow batch failed:\n{got.stderr}")
    m = RATE.search(got.stderr)
    if not m:
        raise SystemExit(f"no rate in the batch's report:\n{got.stderr}")
    return float(m.group(2))


def replica(model: Path, env: dict) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tallow.cli", "serve", str(model), "--port", str(port),
                             "--parallel", str(PARALLEL), "--ctx", str(PARALLEL * 2048)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_ready(url, proc, "tallow serve")
    return proc, url + "/v1"


def stop(procs) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(60)
        except subprocess.TimeoutExpired:
            p.kill()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    model = a.model or default_model()
    env = {**os.environ, "TALLOW_NO_LOG": "1"}
    with tempfile.TemporaryDirectory(prefix="tallow-fleet-") as tmp:
        inp, out = Path(tmp) / "in.jsonl", Path(tmp) / "out.jsonl"
        write_batch(inp, a.requests, a.tokens)
        local_args = [str(inp), "-m", str(model), "--parallel", str(PARALLEL), "--ctx", str(PARALLEL * 2048)]
        print(f"{a.requests} requests of {a.tokens} tokens, {PARALLEL} at a time; model {model.name}")
        servers: list[tuple[subprocess.Popen, str]] = []
        try:
            servers.append(replica(model, env))
            url = servers[0][1]
            remote_args = [str(inp), "-m", "tallow", "--parallel", str(PARALLEL), "--endpoint", url]
            batch(remote_args, env, out)  # warm-up: the replica's first requests
            print("subject batch --endpoint (one replica), reference the in-process batch")
            verdict = compare(Comparison("client cost", lambda arm: batch(remote_args if arm == "subject" else local_args,
                                                                           env, out),
                                         TARGET, False, a.rounds, unit=" tok/s"))
            while len(servers) < 3:
                servers.append(replica(model, env))
            for n in (1, 2, 3):
                args = [str(inp), "-m", "tallow", "--parallel", str(PARALLEL)] + \
                    [x for _, u in servers[:n] for x in ("--endpoint", u)]
                started = time.perf_counter()
                rate = batch(args, env, out)
                print(f"  {n} replica{'s' if n > 1 else ''}: {rate:.1f} tok/s in all "
                      f"({time.perf_counter() - started:.1f} s for the file)")
        finally:
            stop([p for p, _ in servers])
    return exit_code([verdict])


if __name__ == "__main__":
    raise SystemExit(main())
