"""tallow create: a model made from a Modelfile (models/modelfile.py, models/create.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from tallow.cli import options as o
from tallow.cli.models import pull_options, pull_with_progress, store, verify_model
from tallow.cli.render import err_console
from tallow.common.errors import TallowError
from tallow.env import settings

MAX_MODELFILE = 4 * 1024 * 1024  # bytes; a Modelfile is settings and text, never weights


def create(
    name: str = typer.Argument(..., help="The new model's name.", show_default=False),
    file: str = typer.Option("Modelfile", "--file", "-f", help="The Modelfile to read ('-': stdin)."),
    offline: o.Offline = False,
) -> None:
    """Make a model from a Modelfile: a base with its settings.

    The Modelfile names the base (FROM: a stored model, a GGUF path, or a hub reference,
    pulled if it is not stored) and the settings the new model starts from: PARAMETER,
    SYSTEM, TEMPLATE (Jinja) and MESSAGE, as Ollama's. From a stored model only a manifest
    is written: the new model uses its base's files. Flags and request fields still
    override its settings.

    \b
    Examples:
      tallow create terse -f Modelfile
      printf 'FROM smollm2:135m\\nPARAMETER temperature 0\\n' | tallow create greedy -f -
    """
    from tallow.models.create import create_model
    from tallow.models.modelfile import parse
    from tallow.runtime.template import check_template

    text, where, folder = _read(file)
    modelfile = parse(text, where)
    st = store()
    offline = offline or settings.offline()
    opts = pull_options(offline)
    fetch = None if offline else (lambda ref: pull_with_progress(ref, st, opts))
    made = create_model(st, name, modelfile, fetch, check_template, where, verify_model, folder)
    err_console().print(f"created {made.name} from {modelfile.source}", soft_wrap=True, markup=False, highlight=False)


def _read(file: str) -> tuple[str, str, Path]:
    """(the Modelfile's text, its name for messages, the folder its relative paths start from)."""
    if file == "-":
        data = sys.stdin.buffer.read(MAX_MODELFILE + 1)
        where, folder = "stdin", Path.cwd()
    else:
        path = Path(file).expanduser()
        if not path.is_file():
            raise typer.BadParameter(f"{file} is not a readable file", param_hint="--file")
        try:
            with path.open("rb") as f:
                data = f.read(MAX_MODELFILE + 1)
        except OSError as exc:
            raise TallowError(f"cannot read {file}: {exc.strerror}") from exc
        where, folder = str(file), path.resolve().parent
    if len(data) > MAX_MODELFILE:
        raise TallowError(f"{where} is over {MAX_MODELFILE // (1024 * 1024)} MiB: a Modelfile holds settings, not weights")
    try:
        return data.decode("utf-8"), where, folder
    except UnicodeDecodeError as exc:
        raise TallowError(f"{where} is not UTF-8 text (byte {exc.start})") from None
