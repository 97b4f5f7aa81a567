"""The thread count follows the cores that are free: the registry of engines, and the
measurement while decoding (real busy processes, a real llama.cpp context)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tallow.runtime.host.threads import INTERVAL_S, Governor, Registry, physical_cores


def test_the_registry_counts_live_engines_and_sweeps_dead_ones(tmp_path):
    reg = Registry(tmp_path / "engines")
    reg.claim(2)
    assert json.loads(reg.mine.read_text())["threads"] == 2
    assert reg.peers() == {}  # our own claim is not a peer
    peer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        (tmp_path / "engines" / f"{peer.pid}.json").write_text(json.dumps({"threads": 1}))
        (tmp_path / "engines" / "999999999.json").write_text(json.dumps({"threads": 4}))  # no such process
        (tmp_path / "engines" / "junk.json").write_text("not json")
        assert reg.peers() == {peer.pid: 1}
        assert not (tmp_path / "engines" / "999999999.json").exists()
        # a newcomer shares the cores with the engine already running
        gov = Governor(4, None, Registry(tmp_path / "engines"))
        assert gov.start() <= 2
    finally:
        peer.kill()
        peer.wait()
    reg.release()
    assert not reg.mine.exists()


def test_a_pinned_count_never_changes(synth_engine):
    gov = Governor(physical_cores(), 3)
    assert gov.start() == 3
    synth_engine.ctx.set_threads(3)
    time.sleep(INTERVAL_S * 1.2)
    gov.pace(synth_engine.ctx)
    assert synth_engine.ctx.n_threads == 3 and gov.changes == 0
    synth_engine.ctx.set_threads(2)


def _pace_for(gov, ctx, seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        gov.pace(ctx)
        time.sleep(0.02)


@pytest.mark.slow
def test_busy_cores_are_given_up_and_taken_back(synth_engine):
    cores = physical_cores()
    if cores < 2:
        import pytest

        pytest.skip("one core: there is nothing to give up")
    ctx = synth_engine.ctx
    gov = Governor(cores, None)
    ctx.set_threads(cores)
    gov.threads = cores
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cores)]
    try:
        _pace_for(gov, ctx, INTERVAL_S * 6)
        assert ctx.n_threads == 1, "every core is busy: one thread is left"
    finally:
        for p in loops:
            p.kill()
            p.wait()
    import psutil

    psutil.cpu_percent()
    _pace_for(gov, ctx, INTERVAL_S * 6)
    busy_elsewhere = psutil.cpu_percent() / 100 * psutil.cpu_count()  # in cores, this process included (it idles)
    assert ctx.n_threads == gov.threads
    if busy_elsewhere < 0.3:  # only on a quiet machine are all the cores free again
        assert ctx.n_threads == cores, "the cores are free again"
        assert gov.changes >= 2
    ctx.set_threads(2)
