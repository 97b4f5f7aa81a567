"""Shell completion: the scripts for bash, zsh and fish, and the completers for values.

The scripts are Typer's: they call `tallow` back with _TALLOW_COMPLETE set, and `main`
answers before any command runs. Path arguments complete to files (bash and zsh fall
back to the shell's own; for fish, tallow lists them). Model names come from the store's
manifests: no GGUF is read and llama_cpp is never imported.
"""

from __future__ import annotations

from pathlib import Path

COMPLETE_VAR = "_TALLOW_COMPLETE"
FILES = {"bash": "tallow.bash", "zsh": "_tallow", "fish": "tallow.fish"}


def _command():
    import typer.main

    from .app import app

    return typer.main.get_command(app)


def script(shell: str) -> str:
    """The completion script for a shell, as committed under completions/."""
    from typer.completion import get_completion_script

    if shell not in FILES:
        raise ValueError(f"no completion for {shell}")
    return get_completion_script(prog_name="tallow", complete_var=COMPLETE_VAR, shell=shell).rstrip("\n") + "\n"


def complete(instruction: str) -> int:
    """Answer a completion request from one of the scripts (instruction: e.g. complete_bash)."""
    from typer.completion import completion_init, shell_complete, shell_completion

    completion_init()
    # bash (complete -o default) and zsh (_files) fall back to file names when nothing is
    # offered; Typer's fish script says --no-files, so offer them from here.
    fish = shell_completion.get_completion_class("fish")
    item = shell_completion.CompletionItem

    class FishWithFiles(fish):
        def get_completions(self, args, incomplete):
            found = super().get_completions(args, incomplete)
            if found or incomplete.startswith("-"):
                return found
            return [item(p) for p in paths(incomplete)]

    shell_completion.add_completion_class(FishWithFiles, "fish")
    return shell_complete(_command(), {}, "tallow", COMPLETE_VAR, instruction)


def paths(incomplete: str) -> list[str]:
    """Entries of the directory named so far that start with the rest (folders end in /)."""
    import os

    head, _, tail = incomplete.rpartition("/")
    prefix = head + "/" if head or incomplete.startswith("/") else ""
    try:
        entries = sorted(os.scandir(os.path.expanduser(prefix or ".")), key=lambda e: e.name)
    except OSError:
        return []
    return [prefix + e.name + ("/" if e.is_dir() else "") for e in entries
            if e.name.startswith(tail) and (tail.startswith(".") or not e.name.startswith("."))]


def model_names(incomplete: str) -> list[str]:
    """Stored model names, then the catalog's names, that start with what was typed."""
    from tallow.models.catalog import CATALOG

    from .models import store

    try:
        stored = [m.name for m, _ in store().all()[0]]
    except Exception:  # a completion must never print a traceback into the shell
        stored = []
    names = list(dict.fromkeys([*stored, *CATALOG]))
    return [n for n in names if n.startswith(incomplete)]


def quant_types(incomplete: str) -> list[str]:
    from tallow.quantize.types import TYPES

    return [t.name for t in TYPES if t.name.startswith(incomplete.upper())]


def write_all(folder: Path) -> list[Path]:
    """Regenerate completions/ (what the staleness test compares against)."""
    out = []
    for shell, name in FILES.items():
        path = folder / name
        path.write_text(script(shell), encoding="utf-8")
        out.append(path)
    return out


if __name__ == "__main__":  # python -m tallow.cli.completion completions/
    import sys

    for written in write_all(Path(sys.argv[1] if len(sys.argv) > 1 else "completions")):
        print(written)
