"""`tallow docs [TOPIC] [--open] [--path]`: the manual, offline.

The pages (docs/*.md) ship with the package, so `tallow docs running` shows one in the
terminal on any install. The HTML site is what `mkdocs build` makes beside them in a source
checkout (site/, the docs extra); `--open` opens it in the browser when it is there, and
otherwise says how to make it. Nothing is fetched: the pages are files."""

from __future__ import annotations

import webbrowser
from importlib.resources import files
from pathlib import Path
from typing import Annotated, Optional

import typer

from tallow.cli.render import err_console, out_console
from tallow.common.errors import TallowError

BUILD = "pip install 'tallow[docs]', then run mkdocs build in tallow's source folder"


def docs(
    topic: Annotated[Optional[str], typer.Argument(help="A page of the manual: running, models, serving, "
                                                   "clients, commands, ... (all of them without TOPIC).")] = None,
    open_: Annotated[bool, typer.Option("--open", help="Open the built site (or TOPIC's page) in a browser.")] = False,
    path: Annotated[bool, typer.Option("--path", help="Print the folder the pages are in, and nothing else.")] = False,
) -> None:
    """Read the manual: a page here, or the site in a browser.

    Example: tallow docs serving
    """
    folder = Path(str(files("tallow.docs")))
    pages = manual_pages(folder)
    if path:
        out_console().print(str(folder), soft_wrap=True, markup=False, highlight=False)
        return
    name = _page_name(topic, pages) if topic else None
    if open_:
        _open_site(folder, name)
    elif name is None:
        _list(folder, pages)
    else:
        _show(pages[name])


def manual_pages(folder: Path) -> dict[str, Path]:
    """The pages by name: `running`, `reference/commands`, ... (DESIGN.md is the engineers')."""
    found = [p for p in folder.rglob("*.md") if p.name != "DESIGN.md"]
    return {p.relative_to(folder).with_suffix("").as_posix(): p
            for p in sorted(found, key=lambda p: (len(p.relative_to(folder).parts), p.name))}


def _page_name(topic: str, pages: dict[str, Path]) -> str:
    wanted = topic.strip().lower().removesuffix(".md")
    for name in pages:
        if wanted in (name, name.rsplit("/", 1)[-1]):
            return name
    names = ", ".join(n.rsplit("/", 1)[-1] for n in pages if n != "index")
    raise typer.BadParameter(f"no page {topic!r}; the pages: {names}", param_hint="TOPIC")


def _title(page: Path) -> str:
    first = page.read_text(encoding="utf-8").split("\n", 1)[0]
    return first.lstrip("# ").strip()


def _list(folder: Path, pages: dict[str, Path]) -> None:
    console = out_console()
    width = max(len(n.rsplit("/", 1)[-1]) for n in pages)
    for name, page in pages.items():
        if name != "index":
            console.print(f"{name.rsplit('/', 1)[-1]:<{width}}  {_title(page)}", markup=False, highlight=False)
    site = _site(folder)
    err_console().print(f"tallow docs TOPIC shows a page here; the pages are in {folder}; "
                        + (f"the site: {site / 'index.html'} (tallow docs --open)" if site else f"the site: {BUILD}"),
                        soft_wrap=True, markup=False, highlight=False)


def _show(page: Path) -> None:
    from rich.markdown import Markdown

    console = out_console()
    text = page.read_text(encoding="utf-8")
    if not console.is_terminal:  # a pipe or a file gets the Markdown itself
        typer.echo(text, nl=False)
        return
    with console.pager(styles=True):
        console.print(Markdown(text))


def _site(folder: Path) -> Path | None:
    site = folder.parent / "site"
    return site if (site / "index.html").is_file() else None


def _open_site(folder: Path, name: str | None) -> None:
    site = _site(folder)
    if site is None:
        raise TallowError("the manual's site is not built here", f"{BUILD}; or read a page with: tallow docs TOPIC")
    page = site / f"{name or 'index'}.html"
    err_console().print(f"opening {page}", soft_wrap=True, markup=False, highlight=False)
    webbrowser.open(page.as_uri())
