"""tallow completions: print a shell's completion script."""

from __future__ import annotations

import typer


def completions(shell: str = typer.Argument(..., help="bash, zsh or fish.", show_default=False)) -> None:
    """Print the shell completion script for bash, zsh or fish.

    \b
    Examples:
      tallow completions bash > ~/.local/share/bash-completion/completions/tallow
      tallow completions zsh > "${fpath[1]}/_tallow"
      tallow completions fish > ~/.config/fish/completions/tallow.fish
    """
    from tallow.cli.completion import FILES, script

    if shell not in FILES:
        raise typer.BadParameter("use bash, zsh or fish", param_hint="SHELL")
    typer.echo(script(shell), nl=False)
