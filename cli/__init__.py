"""The command line: Typer commands that parse, call one service, and render with Rich."""
