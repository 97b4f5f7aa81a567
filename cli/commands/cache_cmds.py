"""tallow cache: the prompt cache on disk."""

from __future__ import annotations

import json
import sys
from datetime import datetime
from typing import Any

import typer

from tallow.cli import options as o
from tallow.cli.errors import guarded
from tallow.cli.render import err_console, human_bytes
from tallow.env.site import prompt_cache

cache_app = typer.Typer(help="The prompt cache on disk: KV states of prompt prefixes.", no_args_is_help=True)


def ls(as_json: o.JsonList = False) -> None:
    """List cached prompt prefixes, most recently used first.

    Example: tallow cache ls
    """
    entries = sorted(prompt_cache().entries(), key=lambda e: -e.last_used)
    rows: list[dict[str, Any]] = [{"key": e.key, "fingerprint": e.fingerprint, "tokens": len(e.tokens), "bytes": e.size,
             "last_used": datetime.fromtimestamp(e.last_used).isoformat(timespec="seconds")} for e in entries]
    if as_json:
        sys.stdout.write(json.dumps(rows) + "\n")
        return
    for r in rows:
        sys.stdout.write(f"{r['key'][:12]}  {r['tokens']:>7} tokens  {human_bytes(r['bytes']):>10}  "
                         f"last used {r['last_used'].replace('T', ' ')}\n")


def stats(as_json: o.Json = False) -> None:
    """Show the prompt cache's size, cap and entry count.

    Example: tallow cache stats
    """
    st = prompt_cache().stats()
    if as_json:
        sys.stdout.write(json.dumps(st) + "\n")
        return
    sys.stdout.write(f"{st['entries']} entries, {st['tokens']} tokens, {human_bytes(st['bytes'])} of "
                     f"{human_bytes(st['max_bytes'])}; prefixes of {st['min_tokens']}+ tokens are saved\n{st['path']}\n")


def clear() -> None:
    """Delete every cached prompt prefix.

    Example: tallow cache clear
    """
    n, size = prompt_cache().clear()
    err_console().print(f"removed {n} entries, freed {human_bytes(size)}", soft_wrap=True)


for _name, _fn in (("ls", ls), ("stats", stats), ("clear", clear)):
    cache_app.command(_name)(guarded(_fn))
