"""bench --plot: a run's charts (common/charts.py) in the terminal ('-', on stderr, so the rows
still go to stdout) or as SVG files; the value and the library it needs checked before anything
is measured."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tallow.common.charts import EXTRA, charts, terminal, write_svgs
from tallow.common.errors import TallowError


def check_target(target: str) -> None:
    """--plot's value, and the library it needs, checked before anything is measured."""
    import importlib.util

    if target != "-" and not target.endswith(".svg"):
        import typer

        raise typer.BadParameter(f"'-' (the terminal) or a FILE.svg, not {target!r}", param_hint="--plot")
    needed = "plotext" if target == "-" else "pygal"
    if importlib.util.find_spec(needed) is None:
        raise TallowError(f"--plot {target} needs {needed}", EXTRA)


def draw(rows: list[dict[str, Any]], target: str) -> None:
    """bench --plot: the run's charts in the terminal ('-', on stderr) or as SVG files."""
    import shutil
    import sys

    from tallow.cli.render import err_console

    made = charts(rows)
    if target == "-":
        width = min(100, shutil.get_terminal_size((80, 24)).columns)
        colour = sys.stderr.isatty() and err_console().no_color is False
        for chart in made:
            sys.stderr.write(terminal(chart, width, 20, colour) + "\n")
        return
    for path in write_svgs(made, Path(target)):
        err_console().print(f"wrote {path}", soft_wrap=True, markup=False, highlight=False)
