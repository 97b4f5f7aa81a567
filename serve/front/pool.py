"""Runner processes: one per loaded model, started, kept and stopped by the server.

Each runner is a `tallow runner MODEL` process serving that one model (serve/runner/runner_app.py over
a Scheduler) on a private Unix socket. A native crash in llama.cpp kills only that process:
its in-flight requests fail, its last stderr lines are logged, and the next request for the
model starts a new runner (docs/DESIGN.md, "Runners").

`Pool` decides what is loaded. A request names a model; `acquire` returns its runner, first
starting one if none runs: the memory estimate of the load (the fit check's) must fit next to
what is loaded, within `--max-models` and the memory budget; idle runners are stopped, least
recently used first, until it does. A runner that finished its requests stays for its
keep-alive, then a reaper stops it.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from tallow.wire.fields import APIError

FOREVER = None  # a keep-alive that never runs out
STDERR_LINES = 20  # kept per runner, logged when it dies


def parse_keep_alive(value) -> float | None:
    """Seconds to keep a model loaded after a request: a number of seconds, or a duration as
    Ollama takes it ("5m", "1h30m", "90s", "500ms"); 0 unloads at once; negative is forever
    (None). Raises ValueError with the reason."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError("keep_alive must be a duration (\"5m\", \"1h\", \"30s\") or a number of seconds")
    if isinstance(value, str):
        text = value.strip()
        try:
            seconds = float(text)
        except ValueError:
            seconds = _duration(text)
    else:
        seconds = float(value)
    if seconds != seconds or seconds in (float("inf"), float("-inf")):
        raise ValueError("keep_alive must be a finite duration")
    return FOREVER if seconds < 0 else seconds


_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def _duration(text: str) -> float:
    import re

    sign = -1.0 if text.startswith("-") else 1.0
    body = text.lstrip("+-")
    parts = re.findall(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)", body)
    if not body or "".join(n + u for n, u in parts) != body:
        raise ValueError(f"keep_alive {text!r} is not a duration: write it like 5m, 1h30m, 90s or 500ms")
    return sign * sum(float(n) * _UNITS[u] for n, u in parts)


@dataclass(frozen=True)
class Need:
    """What a load will take, from the fit check."""

    ram: int
    vram: int
    problem: str | None = None  # why it cannot load at all, if it cannot


@dataclass
class Runner:
    name: str
    proc: subprocess.Popen
    socket: str
    need: Need
    pinned: bool = False  # preloaded at start: no expiry until a request says otherwise
    state: str = "loading"  # loading | ready | stopping | dead
    info: dict = field(default_factory=dict)  # its ready line: context, slots, memory
    inflight: int = 0
    last_used: float = field(default_factory=time.monotonic)
    expires: float | None = FOREVER  # monotonic time; None: never
    expires_wall: float | None = None  # the same, as a wall-clock time (for /api/ps)
    load_ms: float = 0.0
    stderr: collections.deque = field(default_factory=lambda: collections.deque(maxlen=STDERR_LINES))
    ready: threading.Event = field(default_factory=threading.Event)
    error: str | None = None  # why it failed to load or died

    @property
    def pid(self) -> int:
        return self.proc.pid

    def exit_text(self) -> str:
        code = self.proc.poll()
        if code is None:
            return "still running"
        if code < 0:
            try:
                return f"killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exit status {code}"


@dataclass(frozen=True)
class PoolSettings:
    command: list[str]  # how to start a runner: its argv before MODEL
    args_for: Callable[[str], list[str]]  # the runner's options for a model (load settings, ...)
    socket_dir: Path  # private (0700): the runners' sockets
    max_models: int = 3
    budget: int | None = None  # bytes the loaded models may take in all (None: free memory decides)
    keep_alive: float | None = 300.0  # the default, seconds (None: forever)
    env: dict | None = None
    model_arg: Callable[[str], str] = str  # what the runner's command line names for a model (a name or a file)
    events: Callable[[dict], None] | None = None  # the server's journal: each load, unload and crash recorded


class Pool:
    def __init__(self, settings: PoolSettings, need_of: Callable[[str], Need], free_memory: Callable[[], int],
                 log: Callable[[str], None]) -> None:
        self.settings, self.need_of, self.free_memory, self.log = settings, need_of, free_memory, log
        self.runners: dict[str, Runner] = {}
        self.lock = threading.Lock()
        self.closed = threading.Event()
        self.serial = 0
        self.crashes = 0  # runners that died without being stopped
        self.acquired = 0  # requests (and loads) that took a runner, so far
        self.quiet_since = time.monotonic()  # when the last one was released
        self.reaper = threading.Thread(target=self._reap, name="tallow-reaper", daemon=True)
        self.reaper.start()

    # -- what requests call --------------------------------------------------------------

    def acquire(self, name: str, pinned: bool = False) -> tuple[Runner, float]:
        """The ready runner of model `name`, started if needed (blocking), counted as busy
        until `release`; and the milliseconds this call spent loading it (0 if resident)."""
        started = time.monotonic()
        while True:
            with self.lock:
                runner = self.runners.get(name)
                if runner is None:
                    runner = self._start(name, pinned)
                runner.inflight += 1
                self.acquired += 1
                waited = runner.state == "loading"
            runner.ready.wait()
            if runner.state == "ready":
                return runner, (time.monotonic() - started) * 1000 if waited else 0.0
            with self.lock:
                runner.inflight -= 1
            if runner.state == "dead" and runner.error and runner.info == {}:  # it never loaded
                raise APIError(f"model '{name}' failed to load: {runner.error}", 500, "model", "load_failed",
                               kind="server_error")
            # it died or was stopped while we waited: the next turn starts a new one

    def try_acquire(self, name: str) -> Runner | None:
        """`acquire` without blocking: the model's runner if it is ready now, else None."""
        with self.lock:
            runner = self.runners.get(name)
            if runner is None or runner.state != "ready":
                return None
            runner.inflight += 1
            self.acquired += 1
            return runner

    def release(self, runner: Runner, keep_alive: float | None | str = "default") -> None:
        keep = self.settings.keep_alive if isinstance(keep_alive, str) else keep_alive  # "default"
        with self.lock:
            runner.inflight -= 1
            runner.last_used = self.quiet_since = time.monotonic()
            if keep_alive == "default" and runner.pinned:
                return
            runner.pinned = False
            self._set_expiry(runner, keep)
            if keep == 0 and runner.inflight == 0 and runner.state == "ready":
                self._stop(runner, "keep_alive 0")

    def unload(self, name: str) -> bool:
        """Stop the model's runner once its requests finish; False if it is not loaded."""
        with self.lock:
            runner = self.runners.get(name)
            if runner is None or runner.state not in ("ready", "loading"):
                return False
            runner.pinned = False
            self._set_expiry(runner, 0)
            if runner.inflight == 0:
                self._stop(runner, "unloaded")
            return True

    def activity(self) -> tuple[float, int]:
        """(seconds since a request was last in flight or a model loading, requests so far):
        what a re-measurement of the machine waits on (runtime/calibration/recheck.py)."""
        with self.lock:
            busy = any(r.inflight or r.state == "loading" for r in self.runners.values())
            return (0.0 if busy else time.monotonic() - self.quiet_since), self.acquired

    def loading(self) -> list[str]:
        """The models whose runners are starting now."""
        with self.lock:
            return [r.name for r in self.runners.values() if r.state == "loading"]

    def loaded(self) -> list[Runner]:
        with self.lock:
            return [r for r in self.runners.values() if r.state == "ready"]

    def close(self) -> None:
        self.closed.set()
        with self.lock:
            runners = list(self.runners.values())
            for r in runners:
                self._stop(r, "server stopping", wait=False)
        for r in runners:
            _wait_or_kill(r.proc)

    # -- under the lock -------------------------------------------------------------------

    def _set_expiry(self, runner: Runner, keep: float | None) -> None:
        if keep is FOREVER:
            runner.expires = runner.expires_wall = None
        else:
            runner.expires, runner.expires_wall = time.monotonic() + keep, time.time() + keep

    def _start(self, name: str, pinned: bool) -> Runner:
        need = self.need_of(name)
        if need.problem:
            raise APIError(f"model '{name}' cannot load: {need.problem}", 507, "model", "insufficient_memory",
                           kind="server_error")
        self._make_room(name, need)
        self.serial += 1
        sock = str(self.settings.socket_dir / f"runner-{self.serial}.sock")
        argv = [*self.settings.command, self.settings.model_arg(name), "--socket", sock, *self.settings.args_for(name)]
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=self.settings.env, start_new_session=True)
        runner = Runner(name, proc, sock, need, pinned=pinned)
        self._set_expiry(runner, FOREVER if pinned else self.settings.keep_alive)
        self.runners[name] = runner
        threading.Thread(target=self._watch, args=(runner,), name=f"tallow-runner-{runner.pid}", daemon=True).start()
        return runner

    def _make_room(self, name: str, need: Need) -> None:
        """Stop idle runners, least recently used first, until `need` fits; an APIError with
        the figures if it cannot."""
        from tallow.models.memory import human

        while True:
            live = [r for r in self.runners.values() if r.state in ("loading", "ready")]
            used = sum(r.need.ram + r.need.vram for r in live)
            want = need.ram + need.vram
            reasons = []
            if len(live) >= self.settings.max_models:
                reasons.append(f"{len(live)} models are loaded (--max-models {self.settings.max_models})")
            if self.settings.budget is not None and used + want > self.settings.budget:
                reasons.append(f"it needs {human(want)} and {human(used)} of the {human(self.settings.budget)} "
                               "memory budget is taken")
            free = self.free_memory() - sum(r.need.ram for r in live if r.state == "loading")
            if need.ram > free:
                reasons.append(f"it needs {human(need.ram)} of memory and {human(free)} is free")
            if not reasons:
                return
            idle = sorted((r for r in live if r.inflight == 0 and r.state == "ready"), key=lambda r: r.last_used)
            if not idle:
                busy = ", ".join(r.name for r in live) or "nothing"
                if not live:
                    raise APIError(f"model '{name}' does not fit: {'; '.join(reasons)}", 507, "model",
                                   "insufficient_memory", kind="server_error")
                raise APIError(f"model '{name}' cannot load now: {'; '.join(reasons)}, and every loaded model is "
                               f"busy ({busy}); retry when one is idle", 503, "model", "server_busy",
                               kind="server_error")
            self._stop(idle[0], f"making room for {name}", wait=True)

    def _stop(self, runner: Runner, why: str, wait: bool = False) -> None:
        if runner.state in ("stopping", "dead"):
            return
        runner.state = "stopping"
        if self.runners.get(runner.name) is runner:
            del self.runners[runner.name]
        self.log(f"unloading {runner.name} (runner pid {runner.pid}): {why}")
        self._event({"kind": "unload", "model": runner.name, "pid": runner.pid, "why": why})
        try:
            os.killpg(runner.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        if wait:
            _wait_or_kill(runner.proc)

    # -- threads --------------------------------------------------------------------------

    def _watch(self, runner: Runner) -> None:
        """Read the runner's ready line and stderr until it exits; then say why it ended."""
        threading.Thread(target=self._read_stderr, args=(runner,), daemon=True).start()
        assert runner.proc.stdout is not None and runner.proc.stderr is not None  # both are pipes
        line = runner.proc.stdout.readline()
        if line:
            try:
                runner.info = json.loads(line)
                runner.load_ms = float(runner.info.get("load_ms", 0))
                with self.lock:
                    if runner.state == "loading":
                        runner.state = "ready"
            except ValueError:
                runner.error = f"it said {line[:200]!r} instead of its ready line"
        if runner.state == "ready":
            self._event({"kind": "load", "model": runner.name, "pid": runner.pid, "ms": round(runner.load_ms, 1)})
            runner.ready.set()
        code = runner.proc.wait()
        with self.lock:
            stopping = runner.state == "stopping"
            runner.state = "dead"
            if self.runners.get(runner.name) is runner:
                del self.runners[runner.name]
        time.sleep(0.05)  # the stderr reader's last lines
        if not stopping and not self.closed.is_set():
            self.crashes += 1
            tail = " | ".join(line.strip() for line in runner.stderr if line.strip()) or "(nothing on stderr)"
            lines = tail.split(" | ")
            said = next((ln.removeprefix("error: ") for ln in reversed(lines) if ln.startswith("error: ")), lines[-1])
            runner.error = runner.error or (said if code == 1 else runner.exit_text())  # its error line, not a hint
            self.log(f"runner for {runner.name} (pid {runner.pid}) ended: {runner.exit_text()}; its last lines: {tail}")
            self._event({"kind": "crash", "model": runner.name, "pid": runner.pid, "exit": runner.exit_text(),
                         "error": runner.error})
        runner.ready.set()

    def _event(self, record: dict) -> None:
        if self.settings.events is not None:
            self.settings.events(record)

    def _read_stderr(self, runner: Runner) -> None:
        assert runner.proc.stderr is not None  # a pipe
        for raw in runner.proc.stderr:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            runner.stderr.append(line)
            if line.strip():
                self.log(f"[{runner.name}] {line}")

    def _reap(self) -> None:
        while not self.closed.wait(0.25):
            now = time.monotonic()
            with self.lock:
                for r in list(self.runners.values()):
                    if r.state == "ready" and r.inflight == 0 and r.expires is not None and r.expires <= now:
                        self._stop(r, "keep-alive ran out")


def _wait_or_kill(proc: subprocess.Popen, grace: float = 10.0) -> None:
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
