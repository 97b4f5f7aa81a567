"""bench's curves, for people who would rather look than read: tok/s and TTFT against what the
run varied (the KV cache's depth, sequences at once, threads, batch size; or, against a
server, clients at once and arrival rate), drawn in the terminal (plotext) and written as SVG
(pygal), both from the plot extra (pip install 'tallow[plot]').

`charts(rows)` reads bench's own rows (its -o json), so a saved run draws the same pictures
later: `bench --plot` (cli/screens/plots.py) draws a live run's, and the docs build
(mkdocs_hooks.py) the performance page's from recorded runs. Below cli/ so that the docs
build needs no command-line code."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tallow.common.errors import TallowError

# What a local run can vary, in the order a chart prefers them, with the axis's words.
AXES = (("n_depth", "depth (tokens already in the KV cache)"), ("n_threads", "threads"), ("n_batch", "batch size"))
EXTRA = "pip install 'tallow[plot]' (plotext draws in the terminal, pygal writes SVG)"


@dataclass
class Chart:
    name: str  # a short name: the SVG file's suffix
    title: str
    x_label: str
    y_label: str
    series: dict[str, list[tuple[float, float]]] = field(default_factory=dict)

    def add(self, label: str, x: Any, y: Any) -> None:
        if isinstance(x, (int, float)) and isinstance(y, (int, float)):
            self.series.setdefault(label, []).append((float(x), float(y)))


def charts(rows: list[dict[str, Any]]) -> list[Chart]:
    """The charts a run's rows make: none is an error that says what to vary."""
    made = [c for c in (*_remote(rows), *_parallel(rows), *_local(rows)) if any(len(p) > 1 for p in c.series.values())]
    if not made:
        raise TallowError("nothing in this run varies to draw a curve against",
                          "give several depths (-d 0,512,1024), threads (-t 1,2), batch sizes (-b 256,512), "
                          "--parallel 1,2,4, or against a server --parallel or --rate lists")
    for c in made:
        for points in c.series.values():
            points.sort()
    return made


def _local(rows: list[dict[str, Any]]) -> list[Chart]:
    plain = [r for r in rows if "n_depth" in r and not r.get("n_parallel")]
    axis = next(((k, words) for k, words in AXES if len({r.get(k) for r in plain}) > 1), None)
    if axis is None:
        return []
    key, words = axis
    speed = Chart("speed", f"tok/s against {words.split(' (')[0]}", words, "tokens per second")
    ttft = Chart("ttft", f"time to first token against {words.split(' (')[0]}", words, "TTFT (ms)")
    models = len({r.get("model_name") for r in plain}) > 1
    for r in plain:
        test = str(r.get("test", "")).split(" @")[0]
        label = f"{r.get('model_name')} {test}" if models else test
        speed.add(label, r.get(key), r.get("avg_ts"))
        if r.get("n_prompt"):
            ttft.add(label, r.get(key), r.get("ttft_ms"))
    return [speed, ttft]


def _parallel(rows: list[dict[str, Any]]) -> list[Chart]:
    many = [r for r in rows if r.get("n_parallel")]
    speed = Chart("parallel", "aggregate tok/s against sequences at once", "sequences decoded at once", "tokens per second")
    ttft = Chart("parallel-ttft", "TTFT against sequences at once", "sequences decoded at once", "TTFT p50 (ms)")
    for r in many:
        label = f"{r.get('model_name')} pp{r.get('n_prompt')}+tg{r.get('n_gen')}"
        speed.add(label, r["n_parallel"], r.get("avg_ts"))
        ttft.add(label, r["n_parallel"], r.get("ttft_ms"))
    return [speed, ttft] if many else []


def _remote(rows: list[dict[str, Any]]) -> list[Chart]:
    out = []
    for mode, words in (("concurrency", "clients at once"), ("rate", "requests a second (arrivals)")):
        points = [r for r in rows if r.get("mode") == mode]
        if not points:
            continue
        speed = Chart(f"{mode}", f"output tok/s against {words}", words, "tokens per second (all clients)")
        ttft = Chart(f"{mode}-ttft", f"TTFT against {words}", words, "TTFT (ms)")
        for r in points:
            speed.add("output", r["value"], r.get("output_throughput"))
            if "goodput" in r:
                speed.add("goodput (requests/s meeting the SLO) x 100", r["value"], 100 * r["goodput"])
            for q in ("p50", "p90", "p99"):
                ttft.add(q, r["value"], r.get(f"ttft_ms_{q}"))
        out += [speed, ttft]
    return out


def terminal(chart: Chart, width: int = 80, height: int = 20, colour: bool = True) -> str:
    """The chart drawn with characters, for a terminal."""
    try:
        import plotext as plt
    except ImportError:
        raise TallowError("drawing needs plotext", EXTRA) from None
    plt.clf()
    plt.plotsize(width, height)
    for label, points in chart.series.items():
        plt.plot([x for x, _ in points], [y for _, y in points], label=label, marker="braille")
    plt.title(chart.title)
    plt.xlabel(chart.x_label)
    plt.ylabel(chart.y_label)
    plt.theme("clear" if not colour else "pro")
    text = plt.build()
    return text if colour else plt.uncolorize(text)


def svg(chart: Chart) -> str:
    """The chart as an SVG document: fonts and styles inline, nothing fetched when it is viewed."""
    try:
        import pygal
    except ImportError:
        raise TallowError("writing SVG needs pygal", EXTRA) from None
    xy = pygal.XY(title=chart.title, x_title=chart.x_label, y_title=chart.y_label, show_dots=True, dots_size=3,
                  legend_at_bottom=True, disable_xml_declaration=True, js=[], width=800, height=420)
    for label, points in chart.series.items():
        xy.add(label, points)
    return xy.render(is_unicode=True)


def write_svgs(made: list[Chart], path: Path) -> list[Path]:
    """The first chart at `path`, each other beside it as STEM-NAME.svg; the paths written."""
    written = []
    for i, chart in enumerate(made):
        target = path if i == 0 else path.with_name(f"{path.stem}-{chart.name}{path.suffix or '.svg'}")
        text = svg(chart)
        try:
            target.write_text(text, encoding="utf-8")
        except OSError as exc:
            raise TallowError(f"cannot write {target}: {exc.strerror or exc}") from exc
        written.append(target)
    return written
