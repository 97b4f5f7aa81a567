"""bench --plot: the curves of what a run varied, drawn in the terminal and written as SVG,
from a real run (local, and a capacity sweep against a server), and from saved rows."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest
from helpers.processes import run_tallow

from tallow.common.charts import charts, svg, terminal
from tallow.common.errors import TallowError


def _row(**kw) -> dict:
    return {"model_name": "m.gguf", "n_threads": 2, "n_batch": 512, "n_depth": 0, "n_prompt": 0, "n_gen": 0,
            "avg_ts": 1.0, "ttft_ms": None, **kw}


def test_the_axis_is_what_the_run_varied_and_each_test_is_a_series():
    rows = [_row(test=f"{t} @ d{d}", n_depth=d, n_prompt=p, n_gen=g, avg_ts=s, ttft_ms=f)
            for d, s in ((0, 100.0), (512, 80.0), (1024, 60.0))
            for t, p, g, f in (("pp512", 512, 0, 0.5 * s), ("tg128", 0, 128, None))]
    speed, ttft = charts(rows)
    assert speed.x_label.startswith("depth") and set(speed.series) == {"pp512", "tg128"}
    assert speed.series["tg128"] == [(0, 100.0), (512, 80.0), (1024, 60.0)]
    assert set(ttft.series) == {"pp512"}  # a decode-only test has no TTFT
    threads = charts([_row(test="tg128", n_gen=128, n_threads=t, avg_ts=t * 10.0) for t in (1, 2, 4)])
    assert threads[0].x_label == "threads" and threads[0].series["tg128"][-1] == (4, 40.0)


def test_a_capacity_sweep_draws_throughput_goodput_and_ttft_percentiles():
    rows = [{"mode": "rate", "value": v, "output_throughput": 10.0 * v, "goodput": v / 2, "ttft_ms_p50": 5.0 * v,
             "ttft_ms_p90": 6.0 * v, "ttft_ms_p99": 7.0 * v} for v in (0.5, 1.0, 2.0)]
    speed, ttft = charts(rows)
    assert "arrival" in speed.x_label and len(speed.series) == 2 and set(ttft.series) == {"p50", "p90", "p99"}


def test_a_run_that_varies_nothing_says_what_to_vary():
    with pytest.raises(TallowError, match="varies") as refused:
        charts([_row(test="pp512", n_prompt=512), _row(test="tg128", n_gen=128)])
    assert "-d 0,512,1024" in refused.value.hint


def test_drawn_and_written_with_nothing_to_fetch():
    rows = [_row(test="tg8", n_gen=8, n_depth=d, avg_ts=100.0 - d / 10) for d in (0, 64, 128)]
    chart = charts(rows)[0]
    text = terminal(chart, 70, 16, colour=False)
    assert "tok/s against depth" in text and "tg8" in text and "\x1b[" not in text
    doc = svg(chart)
    root = ET.fromstring(doc)
    assert root.tag.endswith("svg") and "tg8" in doc
    fetched = [e.get(a) for e in root.iter() for a in ("href", "{http://www.w3.org/1999/xlink}href", "src")
               if (e.get(a) or "").startswith(("http", "//"))]
    assert not fetched


@pytest.mark.slow
def test_bench_plot_from_a_real_run_in_the_terminal_and_as_svg(synth_model, tmp_path):
    base = ["bench", str(synth_model), "-p", "16", "-n", "8", "-d", "0,32,64", "-r", "1", "-o", "json"]
    shown = run_tallow([*base, "--plot", "-"], home=tmp_path)
    assert shown.returncode == 0, shown.stderr.decode()
    err = shown.stderr.decode()
    assert "tok/s against depth" in err and "time to first token against depth" in err and "tg8" in err
    assert len(json.loads(shown.stdout)) == 6  # the rows are still the output
    written = run_tallow([*base, "--plot", str(tmp_path / "depth.svg")], home=tmp_path)
    assert written.returncode == 0, written.stderr.decode()
    for name in ("depth.svg", "depth-ttft.svg"):
        assert ET.parse(tmp_path / name).getroot().tag.endswith("svg")
        assert f"wrote {tmp_path / name}" in written.stderr.decode()
    flat = run_tallow(["bench", str(synth_model), "-p", "16", "-n", "8", "-r", "1", "--plot", "-"], home=tmp_path)
    assert flat.returncode == 1 and "varies" in flat.stderr.decode()
    bad = run_tallow(["bench", str(synth_model), "--plot", "chart.png"], home=tmp_path)
    assert bad.returncode == 2 and "--plot" in bad.stderr.decode()


@pytest.mark.slow
def test_bench_plot_of_a_capacity_sweep_against_a_server(replica, tmp_path):
    got = run_tallow(["bench", "synthetic.gguf", "--endpoint", replica.url + "/v1", "--parallel", "1,2", "-p", "16",
                      "-n", "4", "--num-requests", "3", "--plot", str(tmp_path / "sweep.svg")], home=tmp_path)
    assert got.returncode == 0, got.stderr.decode()
    doc = (tmp_path / "sweep.svg").read_text()
    assert "clients at once" in doc and (tmp_path / "sweep-concurrency-ttft.svg").is_file()
