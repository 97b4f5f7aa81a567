"""tallow bench --endpoint: a load test of a replica; goodput search ends; offline refuses
hosts that are not this machine."""

from __future__ import annotations

import json

import pytest
from helpers.processes import run_tallow

pytestmark = pytest.mark.slow  # load sweeps against a replica


def test_concurrency_sweep_figures(replica, tmp_path):
    saved = tmp_path / "saved.json"
    got = run_tallow(["bench", "synthetic.gguf", "--endpoint", replica.url + "/v1", "--parallel", "1,2", "-p", "32",
                      "-n", "8", "--num-requests", "4", "--ignore-eos", "-o", "json", "--save", str(saved)], home=tmp_path)
    assert got.returncode == 0, got.stderr.decode()
    rows = json.loads(got.stdout)
    assert [(r["mode"], r["value"]) for r in rows] == [("concurrency", 1), ("concurrency", 2)]
    for r in rows:
        assert r["completed"] == r["requests"] == 4 and r["failed"] == 0
        assert r["mean_output_tokens"] == 8  # --ignore-eos: exactly -n tokens
        assert r["mean_prompt_tokens"] > 20 and r["request_throughput"] > 0 and r["output_throughput"] > 0
        for name in ("ttft_ms", "e2e_ms", "itl_ms", "tpot_ms"):
            assert 0 < r[f"{name}_p50"] <= r[f"{name}_p90"] <= r[f"{name}_p99"], (name, r)
        assert r["ttft_ms_p50"] < r["e2e_ms_p50"]
    again = run_tallow(["bench", "synthetic.gguf", "--endpoint", replica.url, "--parallel", "1", "-p", "32", "-n", "8",
                        "--num-requests", "4", "--ignore-eos", "--compare", str(saved)], home=tmp_path)
    assert again.returncode == 0, again.stderr.decode()
    table = again.stdout.decode()
    assert "vs saved" in table and "1 at once" in table and "4/4" in table


def test_goodput_search_ends_whether_the_slo_holds_or_not(replica, tmp_path):
    base = ["bench", "synthetic.gguf", "--endpoint", replica.url, "-p", "16", "-n", "4", "--num-requests", "3",
            "--max-seconds", "20", "-o", "json"]
    loose = run_tallow(base + ["--ttft-ms", "600000", "--tpot-ms", "600000"], home=tmp_path, timeout=600)
    assert loose.returncode == 0, loose.stderr.decode()
    rows = json.loads(loose.stdout)
    assert 1 <= len(rows) <= 8 and all(r["mode"] == "rate" and r["slo_attainment"] == 1.0 for r in rows)
    assert [r["value"] for r in rows] == sorted(r["value"] for r in rows)  # it only doubled
    assert "holds up to" in loose.stderr.decode()
    strict = run_tallow(base + ["--ttft-ms", "1", "--tpot-ms", "0.1"], home=tmp_path, timeout=600)
    assert strict.returncode == 0, strict.stderr.decode()
    rows = json.loads(strict.stdout)
    assert 1 <= len(rows) <= 8 and all(r["goodput"] == 0 for r in rows)
    assert "not met at any rate tried" in strict.stderr.decode()


def test_refusals(tmp_path):
    offline = run_tallow(["bench", "m", "--endpoint", "http://192.0.2.1:8000/v1", "--offline"], home=tmp_path)
    assert offline.returncode == 1 and "offline: refusing the endpoint 192.0.2.1" in offline.stderr.decode()
    no_endpoint = run_tallow(["bench", "m", "--rate", "1"], home=tmp_path)
    assert no_endpoint.returncode == 2 and "--rate" in no_endpoint.stderr.decode()
    local_flag = run_tallow(["bench", "m", "--endpoint", "http://127.0.0.1:9/v1", "-t", "2"], home=tmp_path)
    assert local_flag.returncode == 2 and "-t" in local_flag.stderr.decode()
    half_slo = run_tallow(["bench", "m", "--endpoint", "http://127.0.0.1:9/v1", "--ttft-ms", "100"], home=tmp_path)
    assert half_slo.returncode == 2 and "--tpot-ms" in half_slo.stderr.decode()
