"""A server measures the machine again at a quiet moment when its stored calibration cannot
be trusted (runtime/calibration/recheck.py): the rule, on a recheck whose inputs the test
holds; the real probe child at a lower priority, stored under the profile's key; and the
whole path in `tallow serve`."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest

from tallow.runtime.calibration.machine import ProbeOptions, cached, keep, remeasure
from tallow.runtime.calibration.recheck import Recheck, untrusted
from tallow.runtime.host.threads import physical_cores


class Machine:
    """What a recheck reads and does, held by the test: the stored profile, the server's
    activity, the load, and the measurements it made."""

    def __init__(self, stored, fresh) -> None:
        self.stored, self.fresh = stored, fresh
        self.idle, self.requests, self.load = 0.0, 0, 0.1
        self.measured = 0
        self.arrive = 0  # requests that arrive while the next measurement runs

    def measure(self):
        self.measured += 1
        self.requests += self.arrive
        self.arrive = 0
        return self.fresh

    def recheck(self) -> Recheck:
        return Recheck(lambda: self.stored, self.measure, self.store, lambda: (self.idle, self.requests), quiet_s=60,
                       load=lambda: self.load, cpus=2)

    def store(self, found) -> None:
        self.stored = found


class Stored:
    def __init__(self, busy: bool = False, timing_error: str = "", load: float | None = 1.9) -> None:
        self.busy, self.timing_error, self.load = busy, timing_error, load


def test_a_trusted_calibration_is_never_measured_again():
    m = Machine(Stored(), Stored())
    r = m.recheck()
    m.idle = 1000
    assert r.tick() is None and r.settled and m.measured == 0
    assert untrusted(Stored()) is None
    assert "implausible" in untrusted(Stored(timing_error="implausible timings after a second look"))


def test_a_busy_calibration_is_measured_again_only_when_idle_and_quiet():
    m = Machine(Stored(busy=True), Stored())
    r = m.recheck()
    assert r.tick() is None and m.measured == 0  # a request in flight
    m.idle, m.load = 61, 1.5  # idle, but the machine is busy (over half its 2 CPUs)
    assert r.tick() is None and m.measured == 0
    m.load = None  # an unknown load is not quiet either
    assert r.tick() is None and m.measured == 0
    m.load = 0.4
    line = r.tick()
    assert m.measured == 1 and m.stored is m.fresh and r.settled
    assert "measured this machine again while idle (the machine was busy when it was measured (load 1.90))" in line
    m.stored = Stored(busy=True)
    assert r.tick() is None and m.measured == 1  # settled: it does not look again


def test_what_was_measured_while_a_request_arrived_or_still_busy_is_not_kept():
    m = Machine(Stored(busy=True), Stored())
    r = m.recheck()
    m.idle, m.arrive = 61, 1
    assert "a request arrived meanwhile: nothing kept" in r.tick()
    assert m.stored is not m.fresh and not r.settled
    m.fresh = Stored(busy=True)
    assert "and again the machine was busy" in r.tick()
    assert m.stored is not m.fresh
    m.fresh = Stored()
    r.tick()
    assert m.stored is m.fresh and m.measured == 3


def test_no_stored_profile_yet_waits_for_the_first_load():
    m = Machine(None, Stored())
    r = m.recheck()
    m.idle = 1000
    assert r.tick() is None and m.measured == 0 and not r.settled


def test_the_probe_child_measures_at_a_lower_priority_and_is_stored_under_its_key(tmp_path):
    opts = ProbeOptions(threads=physical_cores(), rounds=2, nice=10)
    fresh = remeasure(opts)
    assert fresh.timings or fresh.timing_error  # it measured, or said why not
    path = tmp_path / "machine.json"
    assert cached(path, opts) is None
    keep(path, replace(fresh, busy=not fresh.busy, calibrated_at=1.0))
    keep(path, fresh)  # the same key: replaced, not added
    found = cached(path, replace(opts, nice=0))  # niceness is not part of the key
    assert found is not None and found.calibrated_at == fresh.calibrated_at and found.busy == fresh.busy
    assert len(json.loads(path.read_text())["profiles"]) == 1


@pytest.mark.slow
def test_serve_measures_again_when_idle(tmp_path):
    from helpers.server import Server

    opts = ProbeOptions(threads=physical_cores())
    path = tmp_path / "machine.json"
    seeded = replace(remeasure(replace(opts, rounds=2)), busy=True, load=9.0, calibrated_at=1.0)
    keep(path, seeded)
    server = Server(None, tmp_path, env={"TALLOW_MACHINE_CACHE": str(path), "TALLOW_TEST_RECHECK": "1"})
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not any("measured this machine again" in line for line in server.log):
            time.sleep(0.5)
    finally:
        server.close()
    said = [line for line in server.log if "measured this machine again" in line]
    assert said and "(the machine was busy when it was measured (load 9.00))" in said[0]
    found = cached(path, opts)
    assert found is not None
    if "models loaded from now on use it" in said[0]:  # it was quiet enough: the new profile is stored
        assert found.calibrated_at > 1.0 and not found.busy
    else:  # the machine was still busy as the probe measured (a loaded CI runner): nothing kept
        assert "and again the machine was busy" in said[0] and found.calibrated_at == 1.0
