"""The request path before and after a change, side by side: tallow at an earlier commit
against this checkout, in alternating child processes on the same machine and model.

Two measurements, each a median of its repetitions, in rounds that alternate before/after
so a busy machine's drift hits both alike:

  http  an OpenAI chat body as the runner receives it (bytes) to the engine request its
        first decode takes: parse_json, the field checks, the template and the tokenizer
        (wire/fields.parse_json -> openai_api.parse_chat -> runtime/intake.to_request), on a
        warm engine of the synthetic model, in-process, 400 calls a repetition
  cli   `tallow run MODEL "hi" -n 1` as a shell runs it: start-up, flags, the model's
        opening and the first decode (one token)

Each revision runs from a tree laid out as the installed package (links to its folders, as
.ci/lint lays them out), on this environment's dependencies, its modules compiled first as
pip compiles an installed package's (else each run would pay for compiling whatever file a
change touched, which no installed tallow does). Judged by the paired harness
(tests/benchmarks/paired.py): each round's ratio (after / before), the median and the
middle half of the rounds, the load; exits 1 when the middle half is over --target (1.0:
never slower), 3 when the target lies inside it after the most rounds (inconclusive).

    python tests/benchmarks/request_path.py --before f212b61 [--rounds 7] [--target 1.0]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from benchmarks.paired import Comparison, compare, exit_code  # noqa: E402

CHILD = r"""
import json, sys, time
from tallow.wire.fields import parse_json
from tallow.wire.openai_api import parse_chat
try:  # where it lives since wire/ only translates; before that, beside the parser
    from tallow.wire.openai_api import to_request
except ImportError:
    from tallow.runtime.intake import to_request
from tallow.wire.request import Limits
from tallow.runtime.engine import Engine
from tallow.runtime.types import LoadSettings

model, reps = sys.argv[1], int(sys.argv[2])
body = json.dumps({"model": "m", "messages": [
    {"role": "system", "content": "You answer briefly and exactly. " * 8},
    {"role": "user", "content": "Which is the longest river in Europe, and how long is it?"}],
    "temperature": 0.7, "top_p": 0.9, "max_tokens": 64, "stop": ["\n\n"], "seed": 7, "stream": True}).encode()
limits = Limits(max_tokens=4096, model="m", n_vocab=300)
with Engine(model, LoadSettings(n_ctx=1024, n_threads=1, check_memory=False)) as engine:
    for _ in range(50):
        to_request(engine, parse_chat(parse_json(body), limits))
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        to_request(engine, parse_chat(parse_json(body), limits))
        times.append(time.perf_counter() - t)
times.sort()
print(json.dumps({"median_us": times[len(times) // 2] * 1e6}))
"""


def link_tree(source: Path, where: Path) -> Path:
    """`where`/tallow/<package> -> `source`/<folder>, from source's pyproject package-dir, compiled."""
    dirs = tomllib.loads((source / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    (where / "tallow").mkdir(parents=True)
    for package, folder in dirs.items():
        (where / "tallow" / package.split(".", 1)[1]).symlink_to(source / folder)
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(where / "tallow")], check=True,
                   stdout=subprocess.DEVNULL)
    return where


def export(rev: str, where: Path) -> Path:
    where.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(where)], input=archive, check=True)
    return where


def env_for(tree: Path, home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TALLOW_")}
    env.update(PYTHONPATH=str(tree), TALLOW_HOME=str(home), TALLOW_NO_LOG="1", TALLOW_OFFLINE="1", NO_COLOR="1",
               TALLOW_MACHINE_CACHE=str(home / "machine.json"))
    return env


def http_us(env: dict[str, str], model: Path, reps: int) -> float:
    r = subprocess.run([sys.executable, "-c", CHILD, str(model), str(reps)], env=env, capture_output=True,
                       text=True, cwd="/")
    if r.returncode != 0:
        raise SystemExit(f"the http child failed:\n{r.stderr}")
    return json.loads(r.stdout.strip().splitlines()[-1])["median_us"]


def cli_s(env: dict[str, str], model: Path, reps: int) -> float:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "tallow.cli", "run", str(model), "hi", "-n", "1", "--temperature",
                            "0", "--no-cache", "--threads", "1"], env=env, capture_output=True, cwd="/")
        times.append(time.perf_counter() - t)
        if r.returncode != 0:
            raise SystemExit(f"tallow run failed:\n{r.stderr.decode()}")
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", default="f212b61", help="the earlier revision (git) to compare with")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--reps", type=int, default=400, help="http calls a repetition")
    ap.add_argument("--cli-reps", type=int, default=3, help="tallow run processes a repetition")
    ap.add_argument("--target", type=float, default=1.0, help="the most after/before may be (median ratio)")
    args = ap.parse_args()
    from helpers.synth import write_synthetic_gguf

    work = Path(tempfile.mkdtemp(prefix="tallow-request-path-"))
    model = write_synthetic_gguf(work / "synth.gguf")
    trees = {"before": link_tree(export(args.before, work / "src-before"), work / "before"),
             "after": link_tree(ROOT, work / "after")}
    envs = {name: env_for(tree, work / f"home-{name}") for name, tree in trees.items()}
    cli_s(envs["after"], model, 1)  # calibrate the machine once, outside the figures
    (work / "home-before").mkdir(exist_ok=True)
    (work / "home-before" / "machine.json").write_bytes((work / "home-after" / "machine.json").read_bytes())
    arm_env = {"reference": envs["before"], "subject": envs["after"]}
    print(f"reference: {args.before}; subject: this checkout", flush=True)
    verdicts = [compare(Comparison("http", lambda arm: http_us(arm_env[arm], model, args.reps), args.target,
                                   rounds=args.rounds, unit=" us")),
                compare(Comparison("cli", lambda arm: cli_s(arm_env[arm], model, args.cli_reps), args.target,
                                   rounds=args.rounds, unit=" s"))]
    return exit_code(verdicts)


if __name__ == "__main__":
    sys.exit(main())
