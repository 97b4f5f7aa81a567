"""Completion in real interactive shells on a pseudo-terminal: bash, zsh and fish, with the
committed scripts, on model names that have ':' in them (bash splits words there)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
from helpers.processes import run_tallow
from helpers.terminal import Terminal

pytestmark = pytest.mark.slow  # real interactive zsh and fish

ROOT = Path(__file__).resolve().parent.parent
TALLOW = Path(sys.executable).parent / "tallow"  # the console script pip installed beside this python
NAMES = ["mymodel:q4km", "mymodel:q8", "smollm2:135m-f16", "smollm2:135m-f16-Q8_0"]
# what is typed, and the line it must complete to (the catalog's qwen2.5:* names also
# start with "q", which is what bash's split at ':' used to complete to)
CASES = [
    ("tallow rm mymodel:q4", "tallow rm mymodel:q4km"),
    ("tallow run smollm2:135m-f16-Q", "tallow run smollm2:135m-f16-Q8_0"),
    ("tallow show mymodel:", "tallow show mymodel:q"),
    ("tallow show smollm2:13", "tallow show smollm2:135m"),
]
SHELLS = {
    # (argv, commands that load the committed script)
    "bash": (["--norc", "--noprofile", "-i"], ["source {root}/completions/tallow.bash"]),
    "zsh": (["-f", "-i"], ["autoload -Uz compinit && compinit -u", "source {root}/completions/_tallow"]),
    "fish": (["--no-config", "-i"], ["source {root}/completions/tallow.fish"]),
}


@pytest.fixture(scope="module")
def store_home(synth_model, tmp_path_factory) -> Path:
    home = tmp_path_factory.mktemp("completion-home")
    for name in NAMES:
        r = run_tallow(["import", str(synth_model), "--name", name, "--link"], home=home)
        assert r.returncode == 0, r.stderr.decode()
    return home


def shell_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TALLOW_", "COMP_", "_TYPER", "BASH_ENV", "ENV"))}
    env.update(TALLOW_HOME=str(home), PATH=f"{TALLOW.parent}{os.pathsep}{env.get('PATH', '')}", TERM="xterm",
               PS1="$ ", PROMPT="$ ", EDITOR="", VISUAL="", HOME=str(home), fish_greeting="")
    return env


@pytest.mark.parametrize("shell", sorted(SHELLS))
def test_model_names_with_colons_complete_in_an_interactive_shell(shell, store_home):
    exe = shutil.which(shell)
    if exe is None:
        pytest.skip(f"{shell} is not installed (.ci/run installs it)")
    assert TALLOW.exists(), f"no tallow console script at {TALLOW}"
    args, setup = SHELLS[shell]
    term = Terminal(args, shell_env(store_home), program=exe, columns=200)
    try:
        for n, command in enumerate(setup):
            term.send(command.format(root=ROOT) + f"; echo READY{n}_\r")
            term.read_until(rf"READY{n}_\s*\n", timeout=60)
        for typed, expected in CASES:
            got = term.completed(typed, timeout=30)
            assert got == expected, f"{shell}: {typed!r} completed to {got!r}, not {expected!r}"
    finally:
        term.kill()
