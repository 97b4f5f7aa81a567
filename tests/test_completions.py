"""Shell completions: committed scripts are current, and values complete from the store."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from helpers.processes import run_tallow

ROOT = Path(__file__).resolve().parent.parent


def test_committed_scripts_are_current():
    from tallow.cli.completion import FILES, script

    stale = [name for shell, name in FILES.items() if (ROOT / "completions" / name).read_text() != script(shell)]
    assert not stale, f"regenerate with: python -m tallow.cli.completion completions/  (stale: {stale})"


def test_completions_command_prints_each_script(tmp_path):
    for shell, name in {"bash": "tallow.bash", "zsh": "_tallow", "fish": "tallow.fish"}.items():
        r = run_tallow(["completions", shell], home=tmp_path)
        assert r.returncode == 0 and r.stdout.decode() == (ROOT / "completions" / name).read_text()
    bad = run_tallow(["completions", "tcsh"], home=tmp_path)
    assert bad.returncode == 2 and b"use bash, zsh or fish" in bad.stderr


def complete(home: Path, shell: str, line: str) -> tuple[list[str], bool]:
    """What the shell would be offered for `line`, and whether llama_cpp was imported."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TALLOW_", "_TYPER", "COMP_"))}
    env.update({"TALLOW_HOME": str(home), "_TALLOW_COMPLETE": f"complete_{shell}"})
    if shell == "bash":
        words = line.split(" ")
        env.update({"COMP_WORDS": line, "COMP_CWORD": str(len(words) - 1)})
    else:
        env["_TYPER_COMPLETE_ARGS"] = line
        if shell == "fish":
            env["_TYPER_COMPLETE_FISH_ACTION"] = "get-args"
    code = ("import sys\nfrom tallow.cli.app import main\ntry:\n    main()\nexcept SystemExit:\n    pass\n"
            "sys.stderr.write('LLAMA_CPP=%s' % ('llama_cpp' in sys.modules))\n")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    return r.stdout.splitlines(), "LLAMA_CPP=True" in r.stderr


def test_model_names_complete_from_the_store_without_llama_cpp(synth_model, tmp_path):
    assert run_tallow(["import", str(synth_model), "--name", "synthy:tiny"], home=tmp_path).returncode == 0
    got, loaded = complete(tmp_path, "bash", "tallow run syn")
    assert got == ["synthy:tiny"] and not loaded
    got, _ = complete(tmp_path, "bash", "tallow run sm")
    assert "smollm2:135m" in got and all(g.startswith("sm") for g in got)  # the catalog too
    got, _ = complete(tmp_path, "bash", "tallow rm ")
    assert "synthy:tiny" in got
    got, loaded = complete(tmp_path, "zsh", "tallow show syn")
    assert "synthy" in "".join(got) and not loaded


def test_options_commands_and_files_complete(tmp_path):
    got, _ = complete(tmp_path, "bash", "tallow quantize m --type Q4_K")
    assert set(got) == {"Q4_K_M", "Q4_K_S"}
    got, _ = complete(tmp_path, "bash", "tallow se")
    assert got == ["search", "serve"]
    (tmp_path / "requests.jsonl").write_text("{}\n")
    (tmp_path / "reqdir").mkdir()
    got, _ = complete(tmp_path, "fish", f"tallow batch {tmp_path}/req")
    assert got == [f"{tmp_path}/reqdir/", f"{tmp_path}/requests.jsonl"]
