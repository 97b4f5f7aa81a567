"""The once-per-machine calibration: the repack probe in a child, its cache, and the
flash-attention choice; tallow doctor."""

from __future__ import annotations

import json
import time

import pytest
from helpers.processes import run_tallow

from tallow.runtime.calibration.machine import Profile, Workload, has_amx

pytestmark = pytest.mark.slow  # calibration probes in child processes


def _env(tmp_path, **extra) -> dict:
    return {"TALLOW_MACHINE_CACHE": str(tmp_path / "machine.json"), **extra}


def _profiles(tmp_path) -> dict:
    return json.loads((tmp_path / "machine.json").read_text())["profiles"]


def test_a_probe_that_crashes_turns_repacking_off_says_so_once_and_the_run_works(default_home, tmp_path):
    env = _env(tmp_path, TALLOW_TEST_PROBE="crash")
    first = run_tallow(["run", "smollm2:135m", "Say hi", "-n", "4", "--temperature", "0"], home=default_home, env=env)
    assert first.returncode == 0, first.stderr.decode()
    assert first.stdout.strip()
    notes = [line for line in first.stderr.decode().splitlines() if "extra buffers are off" in line]
    assert len(notes) == 1 and "SIGSEGV" in notes[0], first.stderr.decode()
    assert first.stderr.decode().count("note: measuring this machine once (~10 s") == 1  # said before it starts
    (profile,) = _profiles(tmp_path).values()
    assert profile["repack"] is False and profile["probed"] is True
    # the timings come from a second, clean child (or, twice implausible on a busy machine, are refused as such)
    assert profile["timings"]["on"]["decode_0"] > 0 if profile["timings"] else \
        profile["timing_error"].startswith("implausible timings"), profile["timing_error"]
    # the verdict is cached: the next command neither probes nor says it again
    second = run_tallow(["run", "smollm2:135m", "Say hi", "-n", "4", "--temperature", "0"], home=default_home, env=env)
    assert second.returncode == 0
    assert "extra buffers" not in second.stderr.decode() and "measuring" not in second.stderr.decode()
    assert _profiles(tmp_path)[profile["key"]]["calibrated_at"] == profile["calibrated_at"]


@pytest.mark.parametrize("args", [["run", "smollm2:135m", "hi"], ["run", "smollm2:135m", "hi", "--ctx", "-4"],
                                  ["chat", "nosuch:model"], ["serve", "nosuch:model"]])
def test_nothing_is_measured_before_the_checks_that_can_fail(tmp_path, args):
    """An empty home, offline: the model is not stored, or a flag is wrong. That is said at
    once; the machine is not calibrated first (it would cost ~10 s)."""
    done = run_tallow(args, home=tmp_path / "home", env=_env(tmp_path, TALLOW_OFFLINE="1"), timeout=60)
    assert done.returncode != 0
    err = done.stderr.decode()
    assert "error:" in err and "measuring" not in err
    assert not (tmp_path / "machine.json").exists()


def test_a_hanging_probe_is_killed_at_its_time_limit(default_home, tmp_path):
    env = _env(tmp_path, TALLOW_TEST_PROBE="hang", TALLOW_TEST_PROBE_TIMEOUT="5")
    started = time.monotonic()
    done = run_tallow(["run", "smollm2:135m", "Say hi", "-n", "2"], home=default_home, env=env, timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    assert "hung (killed after 5 s)" in done.stderr.decode()
    assert time.monotonic() - started < 60
    (profile,) = _profiles(tmp_path).values()
    assert profile["repack"] is False


def test_a_changed_key_calibrates_again_and_a_passing_probe_keeps_repacking(default_home, tmp_path):
    env = _env(tmp_path, TALLOW_TEST_PROBE="probe")
    assert run_tallow(["doctor", "--json", "--no-live"], home=default_home, env=env).returncode == 0
    (key,) = _profiles(tmp_path)
    first = _profiles(tmp_path)[key]
    assert first["probed"] is True
    if not has_amx():  # where no kernel is known to crash, the probe passes and repacking stays on
        assert first["repack"] is True and first["repack_reason"].startswith("probed: ")
    # another thread count is another key: calibrated anew, the first kept
    assert run_tallow(["doctor", "--json", "--no-live", "-t", "1"], home=default_home, env=env).returncode == 0
    assert len(_profiles(tmp_path)) == 2
    # and TALLOW_CPU_REPACK=off is honoured without a probe
    off = run_tallow(["doctor", "--json", "--no-live"], home=default_home, env={**env, "TALLOW_CPU_REPACK": "off"})
    data = json.loads(off.stdout)
    assert data["repack"] == {**data["repack"], "on": False, "probed": False, "reason": "TALLOW_CPU_REPACK=off"}


def test_a_bad_repack_setting_is_one_line(default_home, tmp_path):
    bad = run_tallow(["run", "smollm2:135m", "hi"], home=default_home, env=_env(tmp_path, TALLOW_CPU_REPACK="maybe"))
    assert bad.returncode == 1
    assert bad.stderr.decode().startswith("error: TALLOW_CPU_REPACK='maybe' is not auto, on or off")


@pytest.mark.skipif(not has_amx(), reason="this CPU has no AMX (no amx_tile in /proc/cpuinfo): the real probe has nothing to try")
def test_on_a_cpu_with_amx_the_real_probe_runs_and_run_answers(default_home, tmp_path):
    done = run_tallow(["run", "smollm2:135m", "Why is the sky blue?", "-n", "16"], home=default_home, env=_env(tmp_path))
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.strip()
    (profile,) = _profiles(tmp_path).values()
    assert profile["probed"] is True


def _profile(timings) -> Profile:
    return Profile("k", {}, [], True, "", False, {**timings, "_depth": 1000})


def test_flash_attention_follows_the_timings_and_the_work():
    from tallow.models.memory import Shape

    shape = Shape(30, 576, 9, 384, 49152, 8192, (1,) * 30, 1)
    # FA a little faster when shallow, much slower deep (as on the Intel machines here)
    prof = _profile({"on": {"decode_0": 0.5e-3, "decode_deep": 3.4e-3, "prefill_0": 0.19e-3, "prefill_deep": 0.36e-3},
                     "off": {"decode_0": 0.64e-3, "decode_deep": 1.2e-3, "prefill_0": 0.22e-3, "prefill_deep": 0.41e-3}})
    assert prof.flash_attn_for(shape, Workload(4000, 0)) == "on"  # a long prefill alone
    assert prof.flash_attn_for(shape, Workload(2000, 2000)) == "off"  # a long chat
    assert prof.flash_attn_for(shape, Workload(8, 4)) == "on"  # a few tokens at depth ~0
    faster = _profile({"on": prof.timings["off"], "off": prof.timings["on"]})
    assert faster.flash_attn_for(shape, Workload(2000, 2000)) == "on"
    assert Profile("k", {}, [], True, "", False, None).flash_attn_for(shape, Workload(1, 1)) == "on"


def test_doctor_json_schema(default_home, tmp_path):
    done = run_tallow(["doctor", "--json"], home=default_home, env=_env(tmp_path))
    assert done.returncode == 0, done.stderr.decode()
    d = json.loads(done.stdout)
    assert set(d) >= {"tallow", "python", "llama_cpp_python", "system_info", "cpu", "repack", "flash_attn", "devices",
                      "memory", "paths", "offline", "live", "checks", "ok"}
    assert d["ok"] is True and all(c["ok"] for c in d["checks"])
    assert d["cpu"]["physical_cores"] >= 1 and d["cpu"]["threads"] >= 1
    assert isinstance(d["repack"]["on"], bool) and d["repack"]["reason"]
    fa = d["flash_attn"]
    if "error" in fa:  # twice implausible (a very busy machine): said, and llama.cpp's default used
        assert fa["error"].startswith("implausible timings after a second look")
    else:
        assert fa["on"]["decode_0"] > 0 and fa["off"]["decode_deep"] > 0 and set(fa["noise_pct"]) == {"on", "off"}
        assert isinstance(fa["busy"], bool) and fa["load"] is not None
    assert any(dev["kind"] == "cpu" and dev["total"] > 0 for dev in d["devices"])
    assert 0 < d["memory"]["available"] <= d["memory"]["total"]
    assert d["paths"]["models_bytes"] > 90_000_000
    live = d["live"]
    assert live["stored"] is True and live["decode_tokens"] == 16 and live["decode_tok_s"] > 0 and live["load_ms"] > 0


def test_doctor_without_a_stored_model_says_how_to_get_one(tmp_path):
    done = run_tallow(["doctor"], home=tmp_path / "empty", env=_env(tmp_path))
    assert done.returncode == 0, done.stderr.decode()
    out = done.stdout.decode()
    assert "smollm2:135m is not stored (get it: tallow pull smollm2:135m)" in out
    assert "repack" in out and "CPU" in out


def test_doctor_names_the_failing_check(tmp_path):
    bad = run_tallow(["doctor", "--no-live"], home=tmp_path / "h", env=_env(tmp_path, TALLOW_CPU_REPACK="never"))
    assert bad.returncode == 1
    assert "FAILED" in bad.stdout.decode() and "calibration" in bad.stdout.decode()
    assert bad.stderr.decode().strip().endswith("check failed: calibration")


def test_a_file_llama_cpp_cannot_load_never_enters_the_store(tmp_path):
    import gguf
    import numpy as np
    from helpers.synth import write_synthetic_gguf

    bad = tmp_path / "zero.gguf"
    add = gguf.GGUFWriter.add_tensor

    def zero_dim(self, name, tensor, *a, **k):  # one tensor with a zero-sized dimension
        return add(self, name, np.ones((0,), dtype=np.float32) if name == "blk.0.ffn_norm.weight" else tensor, *a, **k)

    gguf.GGUFWriter.add_tensor = zero_dim
    try:
        write_synthetic_gguf(bad)
    finally:
        gguf.GGUFWriter.add_tensor = add
    home = tmp_path / "home"
    done = run_tallow(["import", str(bad), "--name", "zero:x"], home=home, env=_env(tmp_path))
    assert done.returncode == 1
    assert done.stderr.decode().startswith("error: llama.cpp cannot load zero.gguf: check_tensor_dims: tensor "
                                           "'blk.0.ffn_norm.weight' has wrong shape")
    listed = run_tallow(["list", "--json"], home=home, env=_env(tmp_path))
    assert json.loads(listed.stdout) == []
    assert not list((home / "models").rglob("sha256-*"))  # nothing copied either
