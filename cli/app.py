"""The Typer application: the root command, its commands, and the error boundary."""

from __future__ import annotations

import sys

import typer

from . import settings
from .errors import guarded

app = typer.Typer(
    name="tallow",
    help="Run large language models on your own machine, with honest timings.",
    epilog=settings.env_table() + "\n\nExit codes: 0 ok, 1 error, 2 usage, 130 interrupted.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tallow")
    except PackageNotFoundError:
        return "unknown"


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"tallow {version()}")
        raise typer.Exit()


@app.callback()
def root(
    version: bool = typer.Option(False, "--version", "-V", callback=_show_version, is_eager=True, help="Print the version and exit."),
) -> None:
    """Run large language models on your own machine, with honest timings."""


def _register() -> None:
    from .batch_cmds import batch
    from .bench_cmds import bench
    from .cache_cmds import cache_app
    from .chat import chat
    from .doctor import doctor
    from .embed_cmds import embed, search
    from .history_cmds import logs_app
    from .ps_cmds import ps, stop
    from .run import run
    from .runner_cmds import runner
    from .serve_cmds import serve
    from .quantize_cmds import eval_models, imatrix, quantize
    from .store_cmds import import_model, list_models, pull, rm, show

    commands = (("run", run), ("chat", chat), ("pull", pull), ("list", list_models), ("show", show), ("rm", rm),
                ("import", import_model), ("quantize", quantize), ("eval", eval_models),
                ("imatrix", imatrix), ("bench", bench), ("batch", batch), ("embed", embed), ("search", search), ("serve", serve), ("ps", ps), ("stop", stop), ("doctor", doctor))
    for name, fn in commands:
        app.command(name=name)(guarded(fn))
    app.command(name="completions")(guarded(completions))
    app.command(name="runner", hidden=True)(guarded(runner))  # started by serve, one per loaded model
    app.add_typer(logs_app, name="logs")
    app.add_typer(cache_app, name="cache")



def completions(shell: str = typer.Argument(..., help="bash, zsh or fish.", show_default=False)) -> None:
    """Print the shell completion script for bash, zsh or fish.

    \b
    Examples:
      tallow completions bash > ~/.local/share/bash-completion/completions/tallow
      tallow completions zsh > "${fpath[1]}/_tallow"
      tallow completions fish > ~/.config/fish/completions/tallow.fish
    """
    from .completion import FILES, script

    if shell not in FILES:
        raise typer.BadParameter("use bash, zsh or fish", param_hint="SHELL")
    typer.echo(script(shell), nl=False)


_register()


def main() -> None:
    import os

    from .completion import COMPLETE_VAR

    instruction = os.environ.get(COMPLETE_VAR)
    if instruction:  # a completion script asking: answer, run nothing
        from .completion import complete

        sys.exit(complete(instruction))
    sys.exit(run_app(sys.argv[1:]))


def run_app(argv: list[str]) -> int:
    """Run the app and return its exit code; a usage error (a bad flag or value, a missing
    argument) is one line and a hint, like every other error, not a usage block."""
    from . import errors
    from .errors import EXIT_INTERRUPTED, EXIT_USAGE

    errors.invocation[:] = argv
    try:
        rv = app(argv, prog_name="tallow", standalone_mode=False)
    except typer.Exit as exc:
        return exc.exit_code
    except typer.Abort:
        sys.stderr.write("interrupted\n")
        return EXIT_INTERRUPTED
    except Exception as exc:  # click's usage errors, duck-typed: tallow imports only typer
        if not (hasattr(exc, "format_message") and isinstance(getattr(exc, "exit_code", None), int)):
            raise
        ctx = getattr(exc, "ctx", None)
        if type(exc).__name__ == "NoArgsIsHelpError" and ctx is not None:
            sys.stdout.write(ctx.get_help() + "\n")
            return EXIT_USAGE
        where = ctx.command_path if ctx is not None else "tallow"
        sys.stderr.write(f"error: {exc.format_message()}\nhint: see {where} --help\n")
        return exc.exit_code
    return rv if isinstance(rv, int) else 0
