"""--device, --main-gpu, --split-mode and --tensor-split: checked where they are given, an
unknown device refused by name at load (this CPU build has no GPU device; on the GPU lane
tests/gpu/test_offload.py places models on a real one)."""

from __future__ import annotations

import pytest
from helpers.processes import run_tallow

from tallow.runtime.backend import supports_gpu_offload


def test_an_unknown_device_is_refused_by_name(synth_model, tmp_path):
    for args in (["run", str(synth_model), "hi", "--device", "Vulkan9"], ["serve", str(synth_model), "--device", "Vulkan9"],
                 ["bench", str(synth_model), "-p", "8", "-n", "0", "-r", "1", "--device", "Vulkan9"]):
        r = run_tallow(args, home=tmp_path)
        err = r.stderr.decode()
        assert r.returncode == 1 and "Traceback" not in err, err
        assert "error: unknown device 'Vulkan9': this llama.cpp has " in err, err


@pytest.mark.parametrize("args, message", [
    (["--split-mode", "diagonal"], "'diagonal': use none, layer or row"),
    (["--device", "CUDA0", "--main-gpu", "1"], "1 is not an index into the 1 device(s) of --device"),
    (["--tensor-split", "3,x"], "one per device"),
    (["--device", "CUDA0", "--tensor-split", "1,1"], "one per device"),
    (["--device", ","], "name one or more devices"),
])
def test_bad_placements_are_usage_errors(synth_model, tmp_path, args, message):
    r = run_tallow(["run", str(synth_model), "hi", *args], home=tmp_path)
    assert r.returncode == 2 and message in r.stderr.decode(), r.stderr.decode()


def test_a_split_mode_alone_still_runs(synth_model, tmp_path):
    r = run_tallow(["run", str(synth_model), "hi", "-n", "3", "--split-mode", "none", "--tensor-split", "1"], home=tmp_path)
    assert r.returncode == 0, r.stderr.decode()


def test_placement_is_the_local_engines_and_refused_with_an_endpoint(tmp_path):
    r = run_tallow(["run", "m", "hi", "--endpoint", "http://127.0.0.1:9/v1", "--device", "CUDA0"], home=tmp_path)
    assert r.returncode == 2 and "--device sets the local engine" in r.stderr.decode()


@pytest.mark.skipif(supports_gpu_offload(), reason="a GPU build has devices: tests/gpu covers it")
def test_on_a_cpu_build_the_error_says_there_is_no_gpu_device(synth_model, tmp_path):
    r = run_tallow(["run", str(synth_model), "hi", "--device", "CUDA0"], home=tmp_path)
    assert "this llama.cpp has no GPU device" in r.stderr.decode()
