"""The speed a run sees, against the calibration's prediction (runtime/calibration/watch.py):
decode-call times kept by depth, their growth with depth compared with the growth the
calibration predicted for the flash-attention mode it chose, and a profile found wrong in
use falling back to llama.cpp's default and asking to be measured again.

The timings fed to the watch are made up (a test cannot rely on a machine's speed); the
engine test checks that a real decode loop feeds the watch at the depths it ran at, and
the CLI test that a profile marked by a run is said, kept and acted on by the next load."""

from __future__ import annotations

import json
import random

from test_calibration_judgement import ON, SHAPE, profile

from tallow.runtime.calibration.flash import DEFAULT
from tallow.runtime.calibration.machine import Profile, Workload, note_seen
from tallow.runtime.calibration.recheck import untrusted
from tallow.runtime.calibration.watch import BUCKET, DepthWatch

NS = 1e-9


def fed(predicted: float | None, growth: float, depths=range(0, 3 * BUCKET), seed: int = 1) -> DepthWatch:
    """A watch fed steps of 10 ms plus `growth` a position, three in five slowed by up to
    half again (a shared machine only ever slows a call)."""
    rng, watch = random.Random(seed), DepthWatch(predicted)
    for depth in depths:
        slowed = 1 + (rng.random() * 0.5 if rng.random() < 0.6 else 0.0)
        watch.seen(depth, (10e-3 + growth * depth) * slowed)
    return watch


def test_growth_within_the_prediction_says_nothing_and_well_past_it_says_by_how_much():
    assert fed(400 * NS, 400 * NS).verdict() is None
    assert fed(400 * NS, 800 * NS).verdict() is None  # 2x: within what the prediction's scaling can be off by
    why = fed(100 * NS, 1000 * NS).verdict()
    assert why is not None and "as fast as the calibration predicted" in why
    ratio = float(why.split("depth ")[1].split("x")[0])
    assert 5 < ratio < 20, why  # about 10x, read through the slowed calls' tenth percentile


def test_too_little_seen_says_nothing():
    assert fed(NS, 1000 * NS, range(0, BUCKET)).growth() is None  # one depth bucket
    assert fed(NS, 1000 * NS, range(0, 2 * BUCKET)).growth() is None  # two, but closer than the span
    assert fed(NS, 1000 * NS, [*range(0, 20), *range(2 * BUCKET, 2 * BUCKET + 20)]).growth() is None  # too few
    idle = fed(None, 1000 * NS)
    assert idle.buckets == {} and idle.verdict() is None  # nothing to check: nothing kept
    assert max(len(v) for v in fed(NS, NS).buckets.values()) <= 64  # memory bounded per depth bucket


def test_a_profile_a_run_found_wrong_is_not_acted_on_and_is_measured_again(tmp_path):
    deep_win = {**ON, "decode_deep": ON["decode_deep"] * 3}
    prof = profile(deep_win, ON)
    work = Workload(2000, 2000)
    assert prof.flash_attn_for(SHAPE, work) == "off"
    assert prof.decode_slope(SHAPE, "off") < prof.decode_slope(SHAPE, "on")  # what the choice rested on
    assert untrusted(prof) is None
    path = tmp_path / "machine.json"
    path.write_text(json.dumps({"version": 2, "profiles": {"k": prof.to_dict()}}))
    note_seen(path, "k", "decode slowed with depth 4.0x as fast as the calibration predicted")
    marked = Profile(**json.loads(path.read_text())["profiles"]["k"])
    assert marked.flash_attn_for(SHAPE, work) == DEFAULT
    assert "a run saw its prediction fail: decode slowed" in untrusted(marked)
    note_seen(tmp_path / "none.json", "k", "x")  # no profile stored: nothing written
    assert not (tmp_path / "none.json").exists()


class Seeing(Profile):
    """A profile that keeps what runs saw, as the CLI's does."""

    seen_by_runs: list[str]

    def saw(self, why: str) -> None:
        self.seen_by_runs.append(why)


def test_a_run_feeds_the_watch_at_each_depth_and_tells_the_profile(tmp_path):
    from helpers.synth import write_synthetic_gguf

    from tallow.runtime.engine import Engine
    from tallow.runtime.loadplan import read_shape
    from tallow.runtime.types import LoadSettings, Request, Sampling

    model = write_synthetic_gguf(tmp_path / "m.gguf", ctx_train=4096)
    prof = Seeing(**profile({**ON, "decode_deep": ON["decode_deep"] * 3}, ON).to_dict())
    prof.seen_by_runs = []
    tokens = 2 * BUCKET + 40
    with Engine(model, LoadSettings(n_ctx=4096, n_threads=2, machine=prof)) as engine:
        assert engine.flash_attn == "off" and engine.watch.predicted == prof.decode_slope(read_shape([model]), "off")
        list(engine.stream(Request([1, 2, 3], tokens, (), Sampling(temperature=0), ignore_eos=True)))
        kept = engine.watch.buckets
        # a call for each token after the first, at depths 3 to 1,065 (the prompt is 3 tokens)
        assert sorted(kept) == [0, 1, 2] and [len(kept[b]) for b in kept] == [64, 64, 1065 - 1024 + 1]
        assert prof.seen_by_runs == []
        kept[2] = [1.0] * 64  # steps a second long at depth 1,024: past any prediction
        engine.watch.quiet = lambda threads: True
    assert len(prof.seen_by_runs) == 1 and "as fast as the calibration predicted" in prof.seen_by_runs[0]
    forced = LoadSettings(n_ctx=4096, n_threads=2, machine=prof, flash_attn="on")
    with Engine(model, forced) as engine:  # the person chose: nothing to check
        assert engine.watch.predicted is None


def test_a_busy_machine_says_nothing_of_the_prediction():
    seen: list[str] = []
    machine = type("Keeps", (), {"saw": lambda self, why: seen.append(why)})()
    slow = fed(100 * NS, 1000 * NS)
    slow.quiet = lambda threads: threads < 2  # busy beside a run of 2 threads
    slow.report(machine, 2)
    assert seen == [] and slow.verdict() is not None  # the growth was seen, and not believed
    slow.report(machine, 1)
    assert len(seen) == 1
    fed(100 * NS, 100 * NS).report(machine, 1)  # as predicted: nothing to say
    assert len(seen) == 1


def test_the_clis_profile_says_and_keeps_what_a_run_saw(tmp_path, monkeypatch, capsys):
    from tallow.env.machine import LazyProfile

    path = tmp_path / "machine.json"
    prof = profile({**ON, "decode_deep": ON["decode_deep"] * 3}, ON)
    path.write_text(json.dumps({"version": 2, "profiles": {"k": prof.to_dict()}}))
    monkeypatch.setenv("TALLOW_MACHINE_CACHE", str(path))
    lazy = LazyProfile(2)
    lazy.saw("decode slowed")  # no profile read yet: nothing was chosen from it, nothing to say
    assert capsys.readouterr().err == "" and json.loads(path.read_text())["profiles"]["k"]["seen"] == ""
    lazy._profile = prof  # noqa: SLF001 - as the load that read it leaves it
    lazy.saw("decode slowed with depth 4.0x as fast as the calibration predicted")
    assert "note: decode slowed with depth 4.0x" in capsys.readouterr().err
    assert json.loads(path.read_text())["profiles"]["k"]["seen"].startswith("decode slowed with depth 4.0x")
