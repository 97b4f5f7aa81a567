"""llama.cpp's own tools (llama-bench, llama-perplexity, llama-server), built from the very
source llama-cpp-python vendors, and a way to run tallow in a fresh process as a user would:
the two sides of the comparisons in busy.py, repack.py, defaults.py, perplexity.py and
llamaserver.py.

The build (about 5 minutes a tool on 2 cores) goes to ~/.cache/tallow-bench once: pip
downloads llama-cpp-python's source distribution from the configured index (no other
network), and CMake builds the target with llama-cpp-python's own defaults (GGML_NATIVE).
`--llama-bench PATH` or TALLOW_LLAMA_BENCH names a llama-bench binary instead.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import tempfile
from importlib.metadata import version
from pathlib import Path

CACHE = Path.home() / ".cache" / "tallow-bench"


def llama_bench(explicit: str | None = None) -> Path:
    return llama_tool("llama-bench", explicit or os.environ.get("TALLOW_LLAMA_BENCH"))


def llama_tool(target: str, explicit: str | None = None, flavour: str = "", cmake_args: tuple[str, ...] = ()) -> Path:
    """A llama.cpp tool (llama-bench, llama-perplexity, llama-server) built once from the source
    llama-cpp-python vendors; `explicit` names a binary instead. A `flavour` ("vulkan",
    "cuda") builds into a folder of its own with its `cmake_args` (the backend's flags)."""
    if explicit:
        return Path(explicit)
    ver = version("llama-cpp-python")
    src = CACHE / f"llama.cpp-{ver}"
    build = src / (f"build-{flavour}" if flavour else "build")
    out = build / "bin" / target
    if out.exists():
        return out
    if not (src / "CMakeLists.txt").exists():
        with tempfile.TemporaryDirectory() as tmp:
            print(f"fetching llama-cpp-python {ver}'s source through pip ...", file=sys.stderr)
            subprocess.run([sys.executable, "-m", "pip", "download", f"llama-cpp-python=={ver}", "--no-deps",
                            "--no-binary", ":all:", "-d", tmp, "-q"], check=True)
            (sdist,) = Path(tmp).glob("llama_cpp_python-*.tar.gz")
            with tarfile.open(sdist) as tf:
                prefix = tf.getnames()[0].split("/")[0] + "/vendor/llama.cpp/"
                members = [m for m in tf.getmembers() if m.name.startswith(prefix)]
                for m in members:
                    m.name = m.name[len(prefix):]
                tf.extractall(src, members=[m for m in members if m.name], filter="data")
    print(f"building {target} (once) ...", file=sys.stderr)
    subprocess.run(["cmake", "-S", str(src), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF",
                    "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=ON", *cmake_args],
                   check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", str(build), "--target", target, "-j", str(os.cpu_count() or 2)],
                   check=True, stdout=subprocess.DEVNULL)
    return out


def repack_args(home: Path) -> list[str]:
    """`--repack 0` where tallow's calibration in `home` found llama.cpp's repacked kernels
    crash (AMX on some Xeons: llama-bench itself dies there by SIGSEGV), so both sides run the
    weights in the same layout; nothing elsewhere, where llama-bench keeps its default."""
    try:
        profiles = json.loads((home / "machine.json").read_text())["profiles"].values()
    except (OSError, ValueError, KeyError):
        return []
    return ["--repack", "0"] if any(not p.get("repack", True) for p in profiles) else []


def run_llama_bench(binary: Path, model: Path, *args: str) -> list[dict]:
    """llama-bench's JSON rows (avg_ts per test)."""
    done = subprocess.run([str(binary), "-m", str(model), "-o", "json", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"llama-bench failed ({done.returncode}): {done.stderr[-400:]}")
    return json.loads(done.stdout)


def setup(reps: int = 3):
    """Parse --reps and --llama-bench; (args, the test home holding the default model, the
    environment for tallow there, the llama-bench binary)."""
    import argparse

    from helpers.processes import shared_home

    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=reps)
    ap.add_argument("--llama-bench", default=None)
    args = ap.parse_args()
    home = shared_home()
    env = tallow_env(home, TALLOW_MACHINE_CACHE=str(home / "machine.json"))
    return args, home, env, llama_bench(args.llama_bench)


def tallow_env(home: Path, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TALLOW_")}
    env.update({"TALLOW_HOME": str(home), "NO_COLOR": "1", "TALLOW_NO_LOG": "1", **extra})
    return env


def tallow(args: list[str], env: dict, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tallow.cli", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, **kw)
