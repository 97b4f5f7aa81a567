"""tallow against llama.cpp's llama-bench on whatever GPU backend the installed llama.cpp has
(the Vulkan lane on lavapipe here, CUDA on an NVIDIA GPU): the default model, every layer
offloaded, flash attention on for both, pp512 and tg128 from the same runs, in paired,
alternating rounds (tests/benchmarks/paired.py); and the memory planner's device figure
against what llama.cpp allocates on the device.

    python tests/benchmarks/gpu.py [--rounds 5] [--reps 3] [--llama-bench PATH]

llama-bench is built from the source llama-cpp-python vendors, with the same backend flags
(Vulkan: TALLOW_VULKAN_INCLUDE or ~/.cache/tallow-vulkan's headers, as vulkan-lane.sh
fetches them; CUDA: the GPU's own architecture). Targets: tallow >= 0.97x llama-bench's
tok/s on each test, and the planned device memory within 10% of the allocated. Exits 1 when
one is missed, 2 when the build cannot offload, 3 when the machine was too noisy to say.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.llamabench import llama_tool, run_llama_bench, tallow_env  # noqa: E402
from benchmarks.paired import Comparison, compare_many, exit_code  # noqa: E402

TESTS = ("pp512", "tg128")


def backend_flags() -> tuple[str, tuple[str, ...]] | None:
    """(flavour, CMake flags) for the GPU backend the installed llama.cpp offloads to."""
    from tallow.runtime.host.devices import devices

    gpu = next((d for d in devices() if d.kind in ("gpu", "igpu")), None)
    if gpu is None:
        return None
    if gpu.backend == "Vulkan":
        include = os.environ.get("TALLOW_VULKAN_INCLUDE", str(Path.home() / ".cache/tallow-vulkan/headers/usr/include"))
        return "vulkan", ("-DGGML_VULKAN=on", f"-DVulkan_INCLUDE_DIR={include}")
    if gpu.backend == "CUDA":
        cap = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True,
                             text=True, check=True).stdout.split()[0]
        return "cuda", ("-DGGML_CUDA=on", "-DGGML_CUDA_NO_VMM=on", f"-DCMAKE_CUDA_ARCHITECTURES={cap.replace('.', '')}")
    sys.exit(f"no llama-bench recipe for the {gpu.backend} backend here")


def tallow_rows(env: dict, reps: int) -> dict[str, float]:
    done = subprocess.run([sys.executable, "-m", "tallow.cli", "bench", "smollm2:135m", "-p", "512", "-n", "128",
                           "-ngl", "99", "-fa", "on", "-r", str(reps), "-o", "json"], env=env, capture_output=True,
                          text=True)
    if done.returncode != 0:
        raise RuntimeError(f"tallow bench failed: {done.stderr[-400:]}")
    return {r["test"]: r["avg_ts"] for r in json.loads(done.stdout)}


def native_rows(binary: Path, model: Path, reps: int) -> dict[str, float]:
    rows = run_llama_bench(binary, model, "-p", "512", "-n", "128", "-ngl", "99", "-fa", "1", "-r", str(reps))
    return {("pp" if r["n_prompt"] else "tg") + str(r["n_prompt"] or r["n_gen"]): r["avg_ts"] for r in rows}


def memory_check(model: Path) -> tuple[float, float]:
    from helpers.device_buffers import load_and_read_buffers

    estimate, seen = load_and_read_buffers(model, n_ctx=4096, gpu_layers="all")
    return estimate.vram / 2**20, sum(mib for _, _, mib in seen)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--llama-bench", default=None)
    args = ap.parse_args()
    from helpers.processes import shared_home

    from tallow.models.resolve import locate
    from tallow.models.store import Store

    flags = backend_flags()
    if flags is None:
        print("this llama.cpp build cannot offload to a GPU: nothing to compare", file=sys.stderr)
        sys.exit(2)
    home = shared_home()
    model = locate("smollm2:135m", Store(home / "models")).path
    binary = llama_tool("llama-bench", args.llama_bench, *flags)
    env = tallow_env(home, TALLOW_MACHINE_CACHE=str(home / "machine.json"))
    def run(arm: str) -> tuple[float, ...]:
        rows = tallow_rows(env, args.reps) if arm == "subject" else native_rows(binary, model, args.reps)
        return tuple(rows[t] for t in TESTS)

    print("subject tallow bench, reference llama-bench")
    verdicts = compare_many(Comparison(TESTS[0], run, 0.97, False, args.rounds, unit=" tok/s"),
                            [Comparison(t, run, 0.97, False) for t in TESTS[1:]])
    planned, allocated = memory_check(model)
    off = abs(planned - allocated) / allocated
    print(f"device memory: planned {planned:.1f} MiB, llama.cpp allocated {allocated:.1f} MiB ({off:.1%} apart; "
          "target <= 10%)")
    code = exit_code(verdicts)
    sys.exit(1 if off > 0.10 else code)


if __name__ == "__main__":
    main()
