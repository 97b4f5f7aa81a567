"""tallow serve with a 1,500-token shared system prompt and 8 different user messages sent at
once, each time to a fresh server process: cold (an empty disk prompt cache), then warm (the
system prompt saved by the cold run, loaded into each slot from disk).

    python tests/benchmarks/serve_cache.py [--rounds 3]

Paired, alternating rounds (tests/benchmarks/paired.py), each arm in a home of its own: the
reference a cold server, the subject a warm one (after an untimed cold one saved the system
prompt). An arm's figure is the median TTFT of its 8 requests. Target: warm <= 0.2x cold,
every warm request's prefix from disk. Exits 1 when missed, 3 when the machine was too
noisy to say.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.llamaserver import QUESTIONS, free_port, wait_ready  # noqa: E402

SYSTEM_TOKENS, SLOTS = 1500, 8


def system_prompt(model: Path) -> str:
    """About 1,500 tokens of the shipped prose, cut by the model's own tokenizer."""
    from tallow.quantize.evaluate import shipped_text
    from tallow.runtime.engine import Engine
    from tallow.runtime.types import LoadSettings

    with Engine(model, LoadSettings(n_ctx=512, n_threads=2)) as engine:
        tokens = engine.tokenize(shipped_text())[:SYSTEM_TOKENS]
        return engine.model.detokenize(tokens).decode("utf-8", "replace")


def round_of(url: str, system: str) -> list[tuple[float, int, str | None]]:
    """(client TTFT ms, cached tokens, cache source) of each of SLOTS concurrent requests."""
    out: list = []

    def one(question: str) -> None:
        body = json.dumps({"model": "tallow", "messages": [{"role": "system", "content": system},
                                                          {"role": "user", "content": question}],
                           "max_tokens": 8, "temperature": 0, "stream": True,
                           "stream_options": {"include_usage": True}}).encode()
        req = urllib.request.Request(url + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"})
        started, first, usage = time.perf_counter(), None, {}
        with urllib.request.urlopen(req, timeout=600) as r:
            for raw in r:
                line = raw.decode().strip()
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[6:])
                if first is None and any(c.get("delta", {}).get("content") for c in chunk.get("choices", [])):
                    first = time.perf_counter()
                usage = chunk.get("usage") or usage
        out.append(((first - started) * 1000, usage["prompt_tokens_details"]["cached_tokens"], usage.get("cache_source")))

    threads = [threading.Thread(target=one, args=(q,)) for q in QUESTIONS[:SLOTS]]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(out) == SLOTS, "a request failed"
    return out


def fresh_server(model: Path, env: dict) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tallow.cli", "serve", str(model), "--port", str(port), "--parallel",
                             str(SLOTS), "--ctx", str(SLOTS * 2048), "--threads", "2"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_ready(url, proc, "tallow serve")
    return proc, url


def main() -> int:
    import argparse

    from helpers.processes import shared_home

    from benchmarks.llamabench import tallow_env
    from benchmarks.paired import Comparison, compare, exit_code
    from tallow.models.resolve import locate
    from tallow.models.store import Store

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    home_dir = shared_home()
    # the default model by name: the shared store's blobs hold others too (an embedding model)
    model = locate("smollm2:135m", Store(home_dir / "models")).path
    system = system_prompt(model)
    warm_rows: list = []

    def served(env: dict) -> list:
        proc, url = fresh_server(model, env)
        try:
            return round_of(url, system)
        finally:
            proc.terminate()
            proc.wait(30)

    def measure(arm: str) -> float:
        with tempfile.TemporaryDirectory() as home:  # an empty prompt cache
            env = tallow_env(Path(home), TALLOW_MACHINE_CACHE=str(home_dir / "machine.json"))
            if arm == "subject":
                served(env)  # untimed: the cold server saves the system prompt
            rows = served(env)
        if arm == "subject":
            warm_rows.extend(rows)
        return statistics.median(t for t, _, _ in rows)

    verdict = compare(Comparison("median TTFT, warm / cold", measure, 0.2, True, args.rounds, unit=" ms"))
    sources = sorted({s or "none" for _, _, s in warm_rows})
    print(f"warm requests: cached tokens {min(c for _, c, _ in warm_rows)}-{max(c for _, c, _ in warm_rows)} "
          f"({', '.join(sources)})")
    return exit_code([verdict]) or (0 if sources == ["disk"] else 1)


if __name__ == "__main__":
    sys.exit(main())
