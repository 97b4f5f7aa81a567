"""The Typer application: the root command, its commands, and the error boundary."""

from __future__ import annotations

import functools
from typing import Callable

import typer

from . import settings
from .errors import report

app = typer.Typer(
    name="tallow",
    help="Run large language models on your own machine, with honest timings.",
    epilog=settings.env_table() + "\n\nExit codes: 0 ok, 1 error, 2 usage, 130 interrupted.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tallow")
    except PackageNotFoundError:
        return "unknown"


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"tallow {_version()}")
        raise typer.Exit()


@app.callback()
def root(
    version: bool = typer.Option(False, "--version", "-V", callback=_show_version, is_eager=True, help="Print the version and exit."),
) -> None:
    """Run large language models on your own machine, with honest timings."""


def guarded(fn: Callable) -> Callable:
    """Map every failure inside a command to a one-line error and an exit code."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort, typer.BadParameter):
            raise
        except (Exception, KeyboardInterrupt) as exc:  # noqa: BLE001 - the one error boundary
            raise typer.Exit(report(exc)) from None

    return wrapper


def _register() -> None:
    from .run import run
    from .store_cmds import import_model, list_models, pull, rm, show

    for name, fn in (("run", run), ("pull", pull), ("list", list_models), ("show", show), ("rm", rm), ("import", import_model)):
        app.command(name=name)(guarded(fn))


_register()


def main() -> None:
    app(prog_name="tallow")
