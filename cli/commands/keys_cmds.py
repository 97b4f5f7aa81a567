"""tallow keys: API keys for `tallow serve --auth keys`; tallow usage: what each key used.

Both read and write tallow's database (TALLOW_HOME/history.db), whether or not the history
log is on: keys and usage are the server's accounts, not a log of what was said.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from tallow.cli import options as o
from tallow.cli.errors import guarded
from tallow.cli.render import err_console
from tallow.env import settings

keys_app = typer.Typer(help="API keys for serve --auth keys: make, list, revoke.",
                       no_args_is_help=True)

Models = typer.Option(None, "--models", help="Model names this key may use, shell patterns (repeatable) [default: every model].", show_default=False)
Routes = typer.Option(None, "--routes", help="What the key may do, comma-separated: generate, embed, admin (pull, delete, create, copy, unload, /metrics) [default: generate,embed].", show_default=False)
Tpm = typer.Option(None, "--tokens-per-minute", min=0, help="Prompt and completion tokens a minute (0: no limit).", show_default=False)
Rpm = typer.Option(None, "--requests-per-minute", min=0, help="Requests a minute (0: no limit).", show_default=False)
Conc = typer.Option(None, "--concurrency", min=0, help="Requests in flight at once (0: no limit).", show_default=False)
MaxTok = typer.Option(None, "--max-tokens", min=0, help="The most tokens one answer may have (0: no limit).", show_default=False)
Expires = typer.Option(None, "--expires", help="When the key stops working: YYYY-MM-DD or an ISO time (UTC unless given); 'never' with update.", show_default=False)


def _store():
    from tallow.serve.http.keys import KeyStore

    return KeyStore(settings.history_path())


def _limits(tpm, rpm, conc, max_tokens) -> dict[str, Optional[int]]:
    given = {"tokens_per_minute": tpm, "requests_per_minute": rpm, "concurrency": conc, "max_tokens": max_tokens}
    return {k: v for k, v in given.items() if v is not None}


def create(
    name: str = typer.Argument(..., help="A name for the key (who or what uses it)."),
    models: Optional[list[str]] = Models, routes: Optional[str] = Routes, tokens_per_minute: Optional[int] = Tpm,
    requests_per_minute: Optional[int] = Rpm, concurrency: Optional[int] = Conc, max_tokens: Optional[int] = MaxTok,
    expires: Optional[str] = Expires,
) -> None:
    """Make a key and print it, once: only its digest is stored.

    Example: tallow keys create alice --models 'qwen*' --tokens-per-minute 20000
    """
    from tallow.serve.http.keys import Limits, parse_date, parse_routes

    limits = Limits(**{k: v or None for k, v in _limits(tokens_per_minute, requests_per_minute, concurrency,
                                                        max_tokens).items()})
    plain, key = _store().create(name, tuple(models or ()), parse_routes(routes or "generate,embed"), limits,
                                 parse_date(expires) if expires else None)
    sys.stdout.write(plain + "\n")
    err_console().print(f"key '{key.name}' made; it is shown this once (tallow keeps only its digest)", soft_wrap=True)


def list_keys(as_json: o.JsonList = False) -> None:
    """List keys: their rights, limits and state, never the key.

    Example: tallow keys list
    """
    keys = [k.public() for k in _store().all()]
    if as_json:
        sys.stdout.write(json.dumps(keys) + "\n")
        return
    for k in keys:
        state = "revoked" if k["revoked"] else f"expires {k['expires']}" if k["expires"] else "active"
        limits = " ".join(f"{n}={v}" for n, v in k["limits"].items()) or "no limits"
        sys.stdout.write(f"{k['name']}  {k['prefix']}…  models={','.join(k['models']) or '*'}  "
                         f"routes={','.join(k['routes'])}  {limits}  {state}\n")


def revoke(name: str = typer.Argument(..., help="The key's name.")) -> None:
    """Revoke a key: servers refuse it within a second.

    Streams in flight with it end with an error.

    Example: tallow keys revoke alice
    """
    _store().revoke(name)
    err_console().print(f"key '{name}' revoked", soft_wrap=True)


def update(
    name: str = typer.Argument(..., help="The key's name."),
    models: Optional[list[str]] = Models, routes: Optional[str] = Routes, tokens_per_minute: Optional[int] = Tpm,
    requests_per_minute: Optional[int] = Rpm, concurrency: Optional[int] = Conc, max_tokens: Optional[int] = MaxTok,
    expires: Optional[str] = Expires,
) -> None:
    """Change what a key may do; what is not given stays as it was.

    Example: tallow keys update alice --concurrency 2 --expires never
    """
    from tallow.serve.http.keys import parse_date, parse_routes

    when: object = "keep" if expires is None else None if expires.strip() == "never" else parse_date(expires)
    key = _store().update(name, tuple(models) if models else None, parse_routes(routes) if routes else None,
                          _limits(tokens_per_minute, requests_per_minute, concurrency, max_tokens), when)
    err_console().print(f"key '{key.name}' updated", soft_wrap=True)


for _name, _fn in (("create", create), ("list", list_keys), ("revoke", revoke), ("update", update)):
    keys_app.command(_name)(guarded(_fn))


def usage(
    key: Optional[str] = typer.Option(None, "--key", help="Only this key's requests.", show_default=False),
    model: Optional[str] = typer.Option(None, "--model", help="Only models matching this shell pattern.", show_default=False),
    since: Optional[str] = typer.Option(None, "--since", help="From this time: YYYY-MM-DD, an ISO time, or a span back from now (24h, 7d).", show_default=False),
    by: str = typer.Option("key", "--by", help="Group by key, model or day (UTC)."),
    prices: Optional[Path] = typer.Option(None, "--prices", help="A JSON file of model patterns, each {input, cached_input, output} per million tokens: what the same traffic would cost.", show_default=False),
    as_json: o.JsonList = False,
) -> None:
    """Show what each key used, metered by serve --auth keys.

    \b
    Examples:
      tallow usage --since 7d --by day
      tallow usage --key alice --prices prices.json --json
    """
    from tallow.serve.http.usage import GROUPS, cost, load_prices, parse_since, summarize

    if by not in GROUPS:
        raise typer.BadParameter(f"'{by}' is not one of {', '.join(GROUPS)}", param_hint="--by")
    table = load_prices(prices) if prices is not None else None
    rows = summarize(settings.history_path(), by, key, model, parse_since(since) if since else None)
    for row in rows:
        if table is not None:
            costs = [cost(counts, m, table) for m, counts in row["models"].items()]
            row["cost"] = None if any(c is None for c in costs) else round(sum(c for c in costs if c is not None), 6)
            row["unpriced"] = sorted(m for m, c in zip(row["models"], costs) if c is None)
        if not as_json:
            del row["models"]
    if as_json:
        sys.stdout.write(json.dumps(rows) + "\n")
        return
    if not rows:
        err_console().print("no metered requests (tallow serve --auth keys records them)", soft_wrap=True)
    for r in rows:
        priced = "" if table is None else (f"  cost {r['cost']:.4f}" if r["cost"] is not None
                                           else f"  cost ? (no price for {', '.join(r['unpriced'])})")
        audio = f"  audio {r['audio_ms'] / 1000:.1f} s" if r["audio_ms"] else ""
        sys.stdout.write(f"{r[by]}  {r['requests']} requests  prompt {r['prompt_tokens']} "
                         f"({r['cached_tokens']} cached)  completion {r['completion_tokens']} "
                         f"(reasoning {r['reasoning_tokens']})  media {r['media_tokens']}{audio}{priced}\n")
