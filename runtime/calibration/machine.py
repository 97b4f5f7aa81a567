"""What tallow knows about this machine: decided once, in a child process, and cached.

Two decisions depend on the CPU and on the llama.cpp build, not on the model
(docs/DESIGN.md, "Calibration"):
- extra buffers (repacked weight layouts). Some of llama.cpp's repacked kernels crash on
  some CPUs (AMX on Sapphire Rapids and later: a SIGSEGV at the first decode). When this
  build offers one of the types in PROBED, a child loads the calibration model with extra
  buffers on and decodes; if it dies by a signal or hangs, extra buffers are off here.
- flash attention: whether it is faster depends on the CPU and on the depth of the
  context. The child times prefill and decode at two depths with it on and off, in
  alternating rounds; runtime/calibration/flash.py judges the samples, and
  `flash_attn_for` chooses per context from them, leaving llama.cpp's default only where
  the other mode wins by more than the noise, and never on timings taken while the
  machine was busy.

The verdict is cached in one JSON file, keyed by everything that decides it: the binding's
version and llama.cpp's system info, the CPU's model and flags, the kernel release, the
thread count and the requested mode. A changed key calibrates again.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

# Extra buffer types whose kernels are probed before use (name: why). CPU_REPACK is
# llama.cpp's default path on every x86 and ARM build and is not probed.
PROBED = {"AMX": "llama.cpp's AMX kernels crash on some CPUs (ggml-org/llama.cpp#20824)"}
PROBE_TIMEOUT_S = 120.0
BUSY = 0.5  # a load average over this share of the CPUs: the machine was busy as it was measured
VERSION = 2  # of the cache's format (2: timings from alternating rounds, with their noise)


@dataclass(frozen=True)
class Workload:
    """What a context will do, as far as the caller knows: tokens prefilled, then decoded."""

    prompt_tokens: int
    decode_tokens: int


@dataclass
class Profile:
    key: str
    facts: dict
    extra_buffer_types: list[str]
    repack: bool  # load models with extra buffers
    repack_reason: str
    probed: bool  # a child tried the repacked kernels
    timings: dict | None = None  # {"on"|"off": {decode_0, decode_deep, prefill_0, prefill_deep}} seconds/token
    timing_error: str = ""  # why there are no timings
    spread: dict | None = None  # per mode and measurement: the second best round's excess over the best (the noise)
    load: float | None = None  # the machine's 1-minute load average as the calibration began
    busy: bool = False  # ... over BUSY of its CPUs: the timings are kept, but not acted on
    seen: str = ""  # why a run's speed said the timings do not hold here (runtime/calibration/watch.py): not acted on
    calibrated_at: float = field(default_factory=time.time)
    seconds: float = 0.0  # what the calibration cost

    def to_dict(self) -> dict:
        return asdict(self)

    def flash_attn_for(self, shape, work: Workload) -> str:
        """'on' or 'off' for `work` on a model of this `shape` (models.memory.Shape): the
        mode the timings say is cheaper by more than their noise, else llama.cpp's default
        (runtime/calibration/flash.py); the default when nothing was measured, when it was
        measured on a busy machine (where a measurement can be slowed a hundredfold), or when
        a run's speed said the timings do not hold (`seen`)."""
        from tallow.runtime.calibration.flash import DEFAULT, choose
        from tallow.runtime.calibration.probe_model import N_LAYER

        if not self.timings or shape is None or self.busy or self.seen:
            return DEFAULT
        layers = shape.n_layer / N_LAYER  # per-token overhead of each path scales with the layers
        return choose(self.timings, self.spread, layers, _width(shape), work.prompt_tokens, work.decode_tokens)

    def decode_slope(self, shape, mode: str) -> float | None:
        """Seconds a decode step of a model of this `shape` grows by per position of depth,
        with flash attention `mode`, as the timings predict (None: no timings to say)."""
        if not self.timings or shape is None or mode not in ("on", "off"):
            return None
        t = self.timings[mode]
        return (t["decode_deep"] - t["decode_0"]) / self.timings["_depth"] * _width(shape)


def _width(shape) -> float:
    """A model's attention work per position of depth, in the calibration model's."""
    from tallow.runtime.calibration.probe_model import HEAD_DIM, N_HEAD, N_LAYER

    return shape.n_layer * shape.n_embd / (N_LAYER * N_HEAD * HEAD_DIM)


def cpu_facts() -> dict:
    """The CPU's model name and flags (from /proc/cpuinfo where there is one) and the kernel."""
    found: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                label, _, value = line.partition(":")
                key = {"model name": "cpu", "flags": "flags", "Features": "flags"}.get(label.strip())
                if key and key not in found:
                    found[key] = value.strip()
                if len(found) == 2:
                    break
    except OSError:
        pass
    return {"cpu": found.get("cpu") or platform.processor() or platform.machine(), "flags": found.get("flags", ""),
            "kernel": platform.release(), "arch": platform.machine()}


def has_amx() -> bool:
    return "amx_tile" in cpu_facts()["flags"].split()


def key_of(facts: dict) -> str:
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) and data.get("version") == VERSION else {}


def _write(path: Path, profiles: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".machine-")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump({"version": VERSION, "profiles": profiles}, fh, indent=1)
    os.replace(tmp, path)


@dataclass(frozen=True)
class ProbeOptions:
    mode: str = "auto"  # auto | on | off: extra buffers
    threads: int = 1
    fault: str | None = None  # tests: "crash" or "hang" inside the child
    force_probe: bool = False  # tests: probe even where no PROBED type is offered
    timeout_s: float = PROBE_TIMEOUT_S
    timing: bool = True  # measure flash attention
    rounds: int = 5  # of each flash-attention measurement (runtime/calibration/probe.py)
    nice: int = 0  # the child's niceness: a server measuring again in the background yields to requests


def run_child(args: dict, timeout_s: float, nice: int = 0) -> tuple[dict | None, str]:
    """Run the probe child (runtime/calibration/probe.py) on `args`: (its JSON result, or None and why)."""
    lower = (lambda: os.nice(nice)) if nice else None
    try:
        proc = subprocess.run([sys.executable, "-m", "tallow.runtime.calibration.probe", json.dumps(args)], capture_output=True,
                              timeout=timeout_s, stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=lower)
    except subprocess.TimeoutExpired:
        return None, f"hung (killed after {timeout_s:g} s)"
    if proc.returncode < 0:
        return None, f"died by {signal.Signals(-proc.returncode).name}"
    if proc.returncode != 0:
        tail = proc.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or ["no message"]
        return None, f"failed (exit {proc.returncode}: {tail[0]})"
    try:
        return json.loads(proc.stdout.decode().strip().splitlines()[-1]), ""
    except (ValueError, IndexError):
        return None, "printed no result"


def _child(workdir: Path, extra_buffers: bool, opts: ProbeOptions, fault: str | None) -> tuple[dict | None, str]:
    args = {"task": "calibrate", "model": str(workdir / "calibration.gguf"), "threads": opts.threads,
            "extra_buffers": extra_buffers, "timing": opts.timing, "fault": fault, "rounds": opts.rounds}
    result, why = run_child(args, opts.timeout_s, opts.nice)
    return result, (f"the probe {why}" if why else "")


def check_loadable(paths: list[Path], timeout_s: float = PROBE_TIMEOUT_S, mmproj: Path | None = None) -> None:
    """Let llama.cpp itself read a model's metadata and plan its buffers, allocating no
    weights, in a child process (a crash there costs nothing); raise with its reason. With
    `mmproj`, libmtmd loads that projector for the model too."""
    from tallow.runtime.errors import BackendError

    name = Path(paths[0]).name
    hint = "the file is damaged, or made for a newer llama.cpp than this build"
    task = {"task": "check", "paths": [str(p) for p in paths], **({"mmproj": str(mmproj)} if mmproj else {})}
    result, why = run_child(task, timeout_s)
    if result is None:
        raise BackendError(f"llama.cpp could not read {name}" + (f" with {Path(mmproj).name}" if mmproj else "")
                           + f": its check {why}", hint)
    if not result.get("ok"):
        if result.get("part") == "projector":
            raise BackendError(str(result.get("error")), "use the projector from the model's own repository")
        raise BackendError(f"llama.cpp cannot load {name}: {result.get('error')}", hint)


def calibrate(facts: dict, key: str, extra_types: list[str], opts: ProbeOptions,
              notice: Callable[[str], None]) -> Profile:
    started, load = time.perf_counter(), _load()
    busy = load is not None and load > BUSY * (os.cpu_count() or 1)
    if busy:  # timings that will not be acted on: the fewest rounds, and no second look
        opts = replace(opts, rounds=2)
    risky = [t for t in extra_types if t in PROBED]
    probe = opts.mode == "auto" and (risky or opts.force_probe)
    with tempfile.TemporaryDirectory(prefix="tallow-probe-") as tmp:
        workdir = Path(tmp)
        if probe:
            result, why = _child(workdir, True, opts, opts.fault)
            if result is None:
                what = ", ".join(risky) or "repacked"
                reason = f"{why} with {what} kernels on; extra buffers are off on this machine"
                notice(f"note: {reason} (TALLOW_CPU_REPACK=on to force)")
                result, timing_error = _child(workdir, False, opts, None)
                repack = False
            else:
                repack, reason, timing_error = True, f"probed: {', '.join(risky) or 'repacked'} kernels ran", ""
        else:
            repack = opts.mode != "off" and bool(extra_types)
            if opts.mode in ("on", "off"):
                reason = f"TALLOW_CPU_REPACK={opts.mode}"
            elif not extra_types:
                reason = "this build offers no extra buffer types"
            else:
                reason = f"no probe needed for {', '.join(extra_types)}"
            result, timing_error = _child(workdir, repack, opts, None) if opts.timing else (None, "")
        again = (lambda: None) if busy else (lambda: _child(workdir, repack, opts, None)[0])
        timings, spread, timing_error = judged(result, timing_error, again)
    return Profile(key, facts, extra_types, repack, reason, bool(probe), timings, timing_error, spread=spread,
                   load=load, busy=busy, seconds=round(time.perf_counter() - started, 2))


def judged(result: dict | None, error: str, again: Callable[[], dict | None]) -> tuple[dict | None, dict | None, str]:
    """(timings, spread, why there are none) from the child's samples: an implausible set is
    measured `again` and the two merged; still implausible, none are kept (runtime/calibration/flash.py)."""
    from tallow.runtime.calibration.flash import implausible, merged, summarize

    if not result or not result.get("samples"):
        return None, None, error
    samples = result["samples"]
    timings, spread = summarize(samples, result["depth"])
    if implausible(timings):
        second = again()
        if second and second.get("samples"):
            samples = merged(samples, second["samples"])
            timings, spread = summarize(samples, result["depth"])
        why = implausible(timings)
        if why:
            return None, None, f"implausible timings after a second look ({why}); flash attention: llama.cpp's default"
    return timings, spread, ""


def _load() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def build_facts() -> dict:
    """What identifies the llama.cpp build without loading it: the binding's version and
    the size and time of its libraries (a rebuild for another CPU changes them)."""
    from importlib.metadata import version

    from tallow.runtime.host.devices import lib_dir

    facts: dict[str, Any] = {"llama_cpp_python": version("llama-cpp-python")}
    folder = lib_dir()
    for name in ("libllama.so", "libggml-cpu.so", "libggml.so"):
        try:
            st = (folder / name).stat() if folder else None
        except OSError:
            st = None
        facts[name] = [st.st_size, st.st_mtime_ns] if st else None
    return facts


def _full_facts(opts: ProbeOptions) -> dict:
    return {**cpu_facts(), **build_facts(), "threads": opts.threads, "mode": opts.mode, "timing": opts.timing}


def cached(path: Path, opts: ProbeOptions) -> Profile | None:
    """The stored profile for this machine and these options, if there is one (no calibration)."""
    found = _read(path).get("profiles", {}).get(key_of(_full_facts(opts)))
    return Profile(**found) if found else None


def remeasure(opts: ProbeOptions) -> Profile:
    """A new calibration for this machine and these options, not stored (`keep` stores it)."""
    from tallow.runtime.host.devices import extra_buffer_types

    full = _full_facts(opts)
    return calibrate(full, key_of(full), list(extra_buffer_types()), opts, lambda s: None)


def keep(path: Path, found: Profile) -> None:
    """Store a profile in the cache under its key, beside the others."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "a") as lock:
        _lock(lock)
        profiles = _read(path).get("profiles", {})
        profiles[found.key] = found.to_dict()
        _write(path, profiles)


def note_seen(path: Path, key: str, why: str) -> None:
    """Mark the stored profile `key`: a run's speed said its timings do not hold here (its
    choices fall back to llama.cpp's defaults until it is measured again)."""
    if not path.exists():
        return
    with open(path.with_suffix(".lock"), "a") as lock:
        _lock(lock)
        profiles = _read(path).get("profiles", {})
        if key in profiles:
            profiles[key]["seen"] = why
            _write(path, profiles)


def profile(path: Path, opts: ProbeOptions, notice: Callable[[str], None] = lambda s: None,
            refresh: bool = False) -> Profile:
    """The cached profile for this machine, calibrating first when there is none for its key.
    Concurrent tallow processes calibrate once: the others wait on a lock, then read."""
    full = _full_facts(opts)
    key = key_of(full)
    cached = _read(path).get("profiles", {}).get(key)
    if cached and not refresh:
        return Profile(**cached)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "a") as lock:
        _lock(lock)
        cached = _read(path).get("profiles", {}).get(key)
        if cached and not refresh:
            return Profile(**cached)
        from tallow.runtime.host.devices import extra_buffer_types

        notice("note: measuring this machine once (~10 s; the result is kept for later runs)")
        found = calibrate(full, key, list(extra_buffer_types()), opts, notice)
        profiles = _read(path).get("profiles", {})
        profiles[key] = found.to_dict()
        _write(path, profiles)
        return found


def _lock(fh) -> None:
    try:
        import fcntl

        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
    except ImportError:  # Windows: no lock; two first runs may both calibrate
        pass
