"""The Typer application: the root command, its commands, and the error boundary.

Commands are imported when they run, not when the app is: `tallow --help` lists them from
the table below (their one-line help), and `tallow list` imports the store commands and
nothing else, so a completion or a script pays only for what it runs."""

from __future__ import annotations

import importlib
import sys
from typing import Any

import typer
import typer.core
import typer.main

from tallow.cli.env_flags import MIRRORED, mirror
from tallow.cli.errors import guarded
from tallow.cli.version import version
from tallow.env import settings

# name -> (module, attribute, one-line help as the command's docstring starts, hidden);
# tests/test_cli_surface.py holds each line to the command's own docstring
COMMANDS: dict[str, tuple[str, str, str, bool]] = {
    "run": ("run", "run", "Run a model on one prompt and stream the answer.", False),
    "chat": ("chat", "chat", "Chat with a model, reusing the cache turn after turn.", False),
    "pull": ("store.hub_cmds", "pull", "Download a model: the largest quantization that fits.", False),
    "find": ("store.hub_cmds", "find", "Search the hub for GGUF models and what fits here.", False),
    "list": ("store.store_cmds", "list_models", "List stored models.", False),
    "show": ("store.store_cmds", "show", "Show a model's metadata, tensor types, license and source.", False),
    "rm": ("store.store_cmds", "rm", "Remove models from the store.", False),
    "cp": ("store.store_cmds", "cp", "Copy a model to another name.", False),
    "create": ("store.create_cmds", "create", "Make a model from a Modelfile: a base with its settings.", False),
    "import": ("store.import_cmds", "import_model", "Register a GGUF, or convert a Hugging Face model or LoRA.",
               False),
    "quantize": ("store.quantize_cmds", "quantize", "Quantize a model into a new stored model.", False),
    "eval": ("store.quantize_cmds", "eval_models", "Measure perplexity and KL divergence on a text.", False),
    "imatrix": ("store.quantize_cmds", "imatrix", "Compute an importance matrix for quantize --imatrix.", False),
    "bench": ("bench_cmds", "bench", "Measure prefill and decode speed, like llama-bench.", False),
    "batch": ("batch_cmds", "batch", "Run every request of a JSONL file, many at once.", False),
    "embed": ("embed_cmds", "embed", "Embed texts: one vector per text, or an index to search.", False),
    "search": ("embed_cmds", "search", "Find the stored texts nearest to a query.", False),
    "tokenize": ("embed_cmds", "tokenize", "Split a text into the model's tokens, or count them.", False),
    "transcribe": ("transcribe_cmds", "transcribe", "Transcribe speech to text with a Whisper model.", False),
    "serve": ("serve_cmds", "serve", "Serve models over HTTP: OpenAI, Anthropic and Ollama APIs.", False),
    "ui": ("ui_cmds", "ui", "Open the chat page, starting a loopback server if none runs.", False),
    "ps": ("ps_cmds", "ps", "List the models a running tallow serve has loaded.", False),
    "stop": ("ps_cmds", "stop", "Unload a model from a running tallow serve.", False),
    "doctor": ("doctor", "doctor", "Check this machine and the install, for a bug report.", False),
    "completions": ("completions_cmd", "completions", "Print the shell completion script for bash, zsh or fish.",
                    False),
    # started by serve, one per loaded model
    "runner": ("runner_cmds", "runner", "Serve one model for tallow serve (started by it; not meant to be run by "
               "hand).", True),
    "logs": ("history_cmds", "logs_app", "Show the local history log of runs and chats.", False),
    "cache": ("cache_cmds", "cache_app", "The prompt cache on disk: KV states of prompt prefixes.", False),
    "keys": ("keys_cmds", "keys_app", "API keys for serve --auth keys: make, list, revoke.", False),
    "usage": ("keys_cmds", "usage", "Show what each key used, metered by serve --auth keys.", False),
    "mcp": ("mcp_cmds", "mcp_app", "MCP servers' tools, for run --mcp.", False),
    "launch": ("agents.launch", "launch", "Point a coding agent at tallow and run it.", False),
    "docs": ("docs_cmd", "docs", "Read the manual: a page here, or the site in a browser.", False),
}


def load_command(name: str) -> Any:
    """The click command of one entry of COMMANDS, its module imported now."""
    module, attribute, _, hidden = COMMANDS[name]
    target = getattr(importlib.import_module(f"tallow.cli.commands.{module}"), attribute)
    if isinstance(target, typer.Typer):  # a group of subcommands (logs, cache)
        group = typer.main.get_command(target)
        group.name = name
        return group
    one = typer.Typer(add_completion=False, rich_markup_mode=None)
    one.command(name=name, hidden=hidden)(guarded(target))
    command = typer.main.get_command(one)
    return mirror(name, command) if name in MIRRORED else command


class LazyCommands(typer.core.TyperGroup):
    """The root group: a command is imported when it is looked up to run (or to show its own
    help); the command list in `tallow --help` comes from COMMANDS alone."""

    def __init__(self, **attrs) -> None:
        super().__init__(**attrs)
        self.commands = OnDemand(self.commands)

    def list_commands(self, ctx) -> list[str]:
        return [*COMMANDS, *(n for n in self.commands if n not in COMMANDS)]

    def get_command(self, ctx, cmd_name: str):
        try:
            return self.commands[cmd_name]
        except KeyError:
            return None

    def format_commands(self, ctx, formatter) -> None:
        loaded = self.commands
        stubs = {name: typer.core.TyperCommand(name=name, help=short, hidden=hidden)
                 for name, (_, _, short, hidden) in COMMANDS.items()}
        self.commands = {**stubs, **loaded}  # listed by their one-line help: nothing imported
        try:
            super().format_commands(ctx, formatter)
        finally:
            self.commands = loaded


class OnDemand(dict):
    """The root's commands by name, each loaded the first time it is asked for."""

    def __missing__(self, name: str):
        if name not in COMMANDS:
            raise KeyError(name)
        self[name] = load_command(name)
        return self[name]


app = typer.Typer(
    name="tallow",
    cls=LazyCommands,
    help="Run large language models on your own machine, with honest timings.",
    epilog=settings.env_table() + "\n\nExit codes: 0 ok, 1 error, 2 usage, 130 interrupted.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"tallow {version()}")
        raise typer.Exit()


@app.callback()
def root(
    version: bool = typer.Option(False, "--version", "-V", callback=_show_version, is_eager=True, help="Print the version and exit."),
) -> None:
    """Run large language models on your own machine, with honest timings."""


def main() -> None:
    import os

    from tallow.cli.completion import COMPLETE_VAR

    instruction = os.environ.get(COMPLETE_VAR)
    if instruction:  # a completion script asking: answer, run nothing
        from tallow.cli.completion import complete

        sys.exit(complete(instruction, typer.main.get_command(app)))
    sys.exit(run_app(sys.argv[1:]))


def run_app(argv: list[str]) -> int:
    """Run the app and return its exit code; a usage error (a bad flag or value, a missing
    argument) is one line and a hint, like every other error, not a usage block."""
    from tallow.cli import errors
    from tallow.cli.errors import EXIT_INTERRUPTED, EXIT_USAGE

    errors.invocation[:] = argv
    if not argv and sys.stdin.isatty() and sys.stdout.isatty():
        from tallow.cli.screens.welcome import welcome

        return welcome()
    try:
        rv = app(argv, prog_name="tallow", standalone_mode=False)
    except typer.Exit as exc:
        return exc.exit_code
    except typer.Abort:
        sys.stderr.write("interrupted\n")
        return EXIT_INTERRUPTED
    except Exception as exc:  # click's usage errors, duck-typed: tallow imports only typer
        code = getattr(exc, "exit_code", None)
        if not (hasattr(exc, "format_message") and isinstance(code, int)):
            raise
        ctx = getattr(exc, "ctx", None)
        if type(exc).__name__ == "NoArgsIsHelpError" and ctx is not None:
            sys.stdout.write(ctx.get_help() + "\n")
            return EXIT_USAGE
        where = ctx.command_path if ctx is not None else "tallow"
        sys.stderr.write(f"error: {exc.format_message()}\nhint: see {where} --help\n")
        return code
    return rv if isinstance(rv, int) else 0
