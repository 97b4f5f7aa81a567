"""A llama-cpp-python whose shared library will not load (a CUDA build on a machine without
the NVIDIA driver: it links libcuda.so.1) is one clear error, not a traceback. The GPU-less
CUDA build cannot exist here, so a stand-in `llama_cpp` package fails its import with the
message llama-cpp-python's loader gives."""

from __future__ import annotations

import pytest
from helpers.processes import run_tallow

MESSAGE = ("Failed to load shared library '/venv/lib/llama_cpp/lib/libllama.so': libcuda.so.1: "
           "cannot open shared object file: No such file or directory")


@pytest.fixture
def cuda_without_driver(tmp_path) -> dict:
    package = tmp_path / "site" / "llama_cpp"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(f"raise RuntimeError({MESSAGE!r})\n")
    return {"PYTHONPATH": str(tmp_path / "site")}


def test_run_says_what_is_missing_and_how_to_build_for_the_cpu(cuda_without_driver, synth_model, tmp_path):
    r = run_tallow(["run", str(synth_model), "hi"], home=tmp_path / "home", env=cuda_without_driver)
    err = r.stderr.decode()
    assert r.returncode == 1 and "Traceback" not in err
    assert f"error: llama.cpp could not be loaded: {MESSAGE}" in err
    assert "built for CUDA and needs the NVIDIA driver" in err and "GGML_CUDA_NO_VMM=ON" in err


def test_doctor_names_the_failed_check_and_help_still_works(cuda_without_driver, tmp_path):
    r = run_tallow(["doctor", "--no-live"], home=tmp_path / "home", env=cuda_without_driver)
    assert r.returncode == 1 and "Traceback" not in r.stderr.decode()
    assert "libcuda.so.1" in r.stdout.decode() + r.stderr.decode()
    assert run_tallow(["--help"], home=tmp_path / "home", env=cuda_without_driver).returncode == 0
