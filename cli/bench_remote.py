"""tallow bench --endpoint: load a remote OpenAI-compatible server (client/loadgen.py) and print
request throughput, output tok/s, TTFT / TPOT / ITL / end-to-end percentiles and goodput."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

from tallow.cli.render import err_console
from tallow.common.errors import TallowError

KEY = ("endpoint", "model", "mode", "value", "n_prompt", "n_gen")


def read_prompts(path: Path) -> tuple[dict, ...]:
    """Bodies from a JSONL file: {"prompt": ...} or {"messages": [...]} per line (other fields pass on)."""
    out = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise TallowError(f"cannot read {path}: {exc}") from exc
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            body = json.loads(line)
        except ValueError as exc:
            raise TallowError(f"{path} line {n} is not JSON: {exc}") from None
        if not isinstance(body, dict) or not ("prompt" in body or isinstance(body.get("messages"), list)):
            raise TallowError(f"{path} line {n} needs 'prompt' or 'messages'")
        body.pop("stream", None)
        out.append(body)
    if not out:
        raise TallowError(f"{path} has no prompts")
    return tuple(out)


def bench_remote(endpoint, load, concurrency: list[int], rates: list[float], slo, slo_name: str | None, output: str,
                 save: Path | None, compare: Path | None) -> list[dict]:
    """Each point's row, emitted as `output` (and returned, for --plot)."""
    from tallow.client import loadgen as L

    err = err_console()
    baseline = _saved(compare) if compare else None
    rows: list[dict] = []

    def add(point) -> None:
        row = {"endpoint": endpoint.url, "model": load.model, "n_prompt": load.input_tokens if not load.prompts else None,
               "n_gen": load.output_tokens, "test_time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
               **point.summary(slo)}
        if baseline is not None:
            old = baseline.get(tuple(row[k] for k in KEY))
            row["change_vs_saved"] = (row["output_throughput"] / old["output_throughput"] - 1) \
                if old and old.get("output_throughput") else None
        rows.append(row)
        err.print(f"{row['mode']} {row['value']:g}: {row['completed']}/{row['requests']} answered, "
                  f"{row['output_throughput']:.1f} tok/s, TTFT p90 {row['ttft_ms_p90']:.0f} ms", style="dim", soft_wrap=True)

    for n in concurrency:
        add(L.run_point(endpoint, load, "concurrency", n))
    for r in rates:
        add(L.run_point(endpoint, load, "rate", r))
    best = None
    if slo is not None:
        probe = L.run_point(endpoint, replace(load, requests=3), "concurrency", 1)
        ok = probe.ok
        if not ok:
            raise TallowError(f"{endpoint.url} answered none of 3 requests: {probe.summary()['errors'][0]}" if probe.samples
                              else f"{endpoint.url}: no request finished in time")
        single = 1000.0 / (sum(s.e2e_ms for s in ok) / len(ok))  # requests a second one stream achieves
        points, best = L.goodput_search(endpoint, load, slo, max(0.05, single / 2), on_point=add)
    if not rows:
        raise TallowError("nothing was measured")
    if save:
        save.write_text(json.dumps(rows, indent=1))
    _emit(rows, output)
    if slo is not None:
        head = (f"goodput under the {slo_name + ' ' if slo_name else ''}SLO (TTFT <= {slo.ttft_ms:.0f} ms, "
                f"<= {slo.tpot_ms:.0f} ms per output token, for {slo.attainment:.0%} of requests): ")
        if best is None:
            line = head + "not met at any rate tried"
        else:
            at = max((r for r in rows if r["mode"] == "rate" and r["value"] == round(best, 3)),
                     key=lambda r: r["goodput"], default=None)
            line = head + f"holds up to {best:.3g} requests/s" + (f" ({at['goodput']:.3g} good requests/s, "
                                                                  f"{at['output_throughput']:.1f} tok/s)" if at else "")
        (sys.stderr if output != "table" else sys.stdout).write(line + "\n")
    return rows


def _saved(path: Path) -> dict:
    try:
        rows = json.loads(path.read_text())
        return {tuple(r[k] for k in KEY): r for r in rows}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise TallowError(f"cannot read saved results {path}: {exc}",
                          "write them with tallow bench MODEL --endpoint URL ... --save FILE") from exc


def _emit(rows: list[dict], output: str) -> None:
    from tallow.cli.render import emit_rows

    emit_rows(rows, output, _table)


def _table(rows: list[dict], markdown: bool) -> None:
    head = ["load", "done", "req/s", "out tok/s", "TTFT p50/p90/p99 ms", "TPOT p50/p90 ms", "ITL p50/p99 ms",
            "E2E p50/p90/p99 ms"]
    if any("goodput" in r for r in rows):
        head += ["SLO met", "goodput req/s"]
    if any("change_vs_saved" in r for r in rows):
        head.append("vs saved")
    lines = []
    for r in rows:
        load = f"{r['value']:g} at once" if r["mode"] == "concurrency" else f"{r['value']:g} req/s"
        cells = [load, f"{r['completed']}/{r['requests']}", f"{r['request_throughput']:.2f}",
                 f"{r['output_throughput']:.1f}",
                 f"{r['ttft_ms_p50']:.0f}/{r['ttft_ms_p90']:.0f}/{r['ttft_ms_p99']:.0f}",
                 f"{r['tpot_ms_p50']:.1f}/{r['tpot_ms_p90']:.1f}", f"{r['itl_ms_p50']:.1f}/{r['itl_ms_p99']:.1f}",
                 f"{r['e2e_ms_p50']:.0f}/{r['e2e_ms_p90']:.0f}/{r['e2e_ms_p99']:.0f}"]
        if "SLO met" in head:
            cells += [f"{r['slo_attainment']:.0%}" if "slo_attainment" in r else "-",
                      f"{r['goodput']:.2f}" if "goodput" in r else "-"]
        if "vs saved" in head:
            ch = r.get("change_vs_saved")
            cells.append(f"{ch:+.1%}" if ch is not None else "new")
        lines.append(cells)
    widths = [max(len(h), *(len(c[i]) for c in lines)) for i, h in enumerate(head)]
    w = sys.stdout.write
    if markdown:
        w("| " + " | ".join(h.ljust(n) for h, n in zip(head, widths)) + " |\n")
        w("| " + " | ".join("-" * n for n in widths) + " |\n")
        for c in lines:
            w("| " + " | ".join(x.ljust(n) for x, n in zip(c, widths)) + " |\n")
    else:
        w("  ".join(h.ljust(n) for h, n in zip(head, widths)).rstrip() + "\n")
        for c in lines:
            w("  ".join(x.ljust(n) for x, n in zip(c, widths)).rstrip() + "\n")
    prompts = {r["mean_prompt_tokens"] for r in rows}
    shown = "not reported by the server" if prompts == {None} else \
        ", ".join(f"{p:g}" for p in sorted(p for p in prompts if p is not None))
    w(f"{rows[0]['endpoint']}, model {rows[0]['model']}: measured here; mean prompt tokens {shown}\n")
