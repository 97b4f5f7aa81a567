"""Speculative decoding with a draft model (runtime/drafting/draft_model.py): the answer is the
target's, and the accepted counts are exactly what two script models that differ at known
places predict."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.processes import run_tallow
from helpers.synth import write_synthetic_gguf

from tallow.runtime.drafting.draft_costs import StepCosts
from tallow.runtime.drafting.draft_model import best_length, row_cost

# The target cycles a..h; the draft agrees except after "d", where it says "x" (then "y",
# after which it has no confident guess).
TARGET = {"\n": "a", "a": "b", "b": "c", "c": "d", "d": "e", "e": "f", "f": "g", "g": "h", "h": "a"}
DRAFT = {**TARGET, "d": "x", "x": "y"}


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[Path, Path, Path]:
    folder = tmp_path_factory.mktemp("draft")
    return (write_synthetic_gguf(folder / "target.gguf", seed=5, script=TARGET),
            write_synthetic_gguf(folder / "draft.gguf", seed=5, script=DRAFT), folder)


def _run(home: Path, model: Path, *args: str) -> dict:
    r = run_tallow(["run", str(model), "hi", "-n", "20", "--json", *args], home=home)
    assert r.returncode == 0, r.stderr.decode()
    return json.loads(r.stdout)


def test_greedy_answer_is_the_targets_with_the_predicted_acceptance(pair, tmp_path):
    target, draft, _ = pair
    alone = _run(tmp_path, target, "--temperature", "0")
    drafted = _run(tmp_path, target, "--temperature", "0", "--draft", str(draft), "--draft-max", "4", "--draft-min", "4")
    assert drafted["text"] == alone["text"] == "abcdefgh" * 2 + "abcd"
    # Steps of 4 drafted tokens after a, e, b, e, b: "bcdx" keeps 3, "fgha" 4, "cdxy" 2, "fgha" 4,
    # and the last "cdxy" 2 (the answer's 20th token ends it).
    assert (drafted["usage"]["draft_tokens"], drafted["usage"]["accepted_tokens"]) == (20, 15)
    assert drafted["usage"]["draft_steps"] == 5 and drafted["usage"]["draft"] == "draft.gguf"
    assert drafted["draft"] == {"with": "draft.gguf", "acceptance": 0.75, "mean_length": 4.0}
    assert alone["usage"]["draft"] is None and "draft" not in alone


def test_the_stats_line_and_the_history_log_name_the_draft(pair, tmp_path):
    target, draft, _ = pair
    args = ["run", str(target), "hi", "-n", "20", "--temperature", "0", "--draft", str(draft), "--draft-max", "4",
            "--draft-min", "4", "--stats"]
    r = run_tallow(args, home=tmp_path)
    assert r.returncode == 0, r.stderr.decode()
    assert "draft by draft.gguf 15/20 accepted (75%, 4.0 a step)" in r.stderr.decode()
    logged = run_tallow(["logs", "-n", "1", "--json"], home=tmp_path)
    (turn,) = json.loads(logged.stdout)
    assert turn["usage"]["draft"] == "draft.gguf" and turn["usage"]["accepted_tokens"] == 15
    shown = run_tallow(["logs", "-n", "1"], home=tmp_path).stdout.decode()
    assert "target.gguf  draft draft.gguf" in shown


def test_sampled_answer_is_the_targets_for_the_same_seed(tmp_path):
    # Random weights, one vocabulary: a draft that guesses badly, forced to draft every step.
    target = write_synthetic_gguf(tmp_path / "t.gguf", seed=11)
    bad = write_synthetic_gguf(tmp_path / "d.gguf", seed=99)
    drafted_tokens = accepted = 0
    for seed in ("1", "2", "3"):
        args = ("--temperature", "0.8", "--seed", seed)
        alone = _run(tmp_path, target, *args)
        drafted = _run(tmp_path, target, *args, "--draft", str(bad), "--draft-min", "2", "--draft-p-min", "0")
        assert drafted["text"] == alone["text"]
        drafted_tokens += drafted["usage"]["draft_tokens"]
        accepted += drafted["usage"]["accepted_tokens"]
    assert drafted_tokens > 20 and accepted < drafted_tokens / 2  # it drafted, and mostly wrongly


# After "q" the target says "a"; after "a" it samples among b, c, d, e (logits 1.6 .. 0.4;
# with top-k 4 at temperature 1: p = 0.41, 0.28, 0.19, 0.12). The draft always guesses "e".
SAMPLED = {"q": {"a": 40.0}, "a": {"b": 1.6, "c": 1.2, "d": 0.8, "e": 0.4}}
WRONG = {"q": "a", "a": "e"}


def test_a_bad_draft_leaves_the_sampled_distribution_the_targets(tmp_path):
    """The second token of 1,200 seeded answers, drafted every time by a draft that guesses the
    least likely token, against the target's own distribution: a chi-square test. The seeds
    are fixed, so the outcome is too (it cannot flake); accepting the guess without checking
    it would put every answer on "e" (chi-square in the thousands)."""
    import numpy as np

    from tallow.quantize.evaluate import logits_for
    from tallow.runtime.engine import Engine
    from tallow.runtime.types import DraftLimits, LoadSettings, Request, Sampling

    target = write_synthetic_gguf(tmp_path / "t.gguf", seed=5, script=SAMPLED)
    bad = write_synthetic_gguf(tmp_path / "d.gguf", seed=5, script=WRONG)
    with Engine(target, LoadSettings(n_ctx=256, n_threads=2, flash_attn="on", draft=(bad,),
                                     draft_limits=DraftLimits(max=2, min=2, p_min=0.0))) as engine:
        q, a = engine.tokenize("q"), engine.tokenize("a")
        row = logits_for(engine, q + a)[-1].astype(np.float64)
        top = [int(t) for t in np.argsort(row)[::-1][:4]]
        p = np.exp(row[top] - row[top].max())
        p /= p.sum()
        counts, drafted, accepted = dict.fromkeys(top, 0), 0, 0
        seeds = 1200
        for seed in range(seeds):
            sampling = Sampling(temperature=1.0, top_k=4, top_p=1.0, min_p=0.0, seed=seed)
            events = list(engine.stream(Request(q, max_tokens=3, sampling=sampling, draft="model")))
            second, final = events[1].token, events[-1]
            counts[second] += 1
            drafted, accepted = drafted + final.usage.draft_tokens, accepted + final.usage.accepted_tokens
        assert 1 in engine.drafts.costs.catch_ms and 1 in engine.drafts.costs.token_ms  # the draft's calls, timed
        assert top == [engine.tokenize(x)[0] for x in "bcde"]  # the four successors the script set, in order
    observed = np.array([counts[t] for t in top], dtype=np.float64)
    chi2 = float(((observed - seeds * p) ** 2 / (seeds * p)).sum())
    assert chi2 < 16.27, (chi2, observed, seeds * p)  # 3 degrees of freedom, p = 0.001
    assert drafted >= seeds and accepted < 0.25 * drafted  # the draft was checked at every answer, and mostly wrong


def test_a_draft_of_another_vocabulary_is_refused(pair, default_home):
    _, draft, _ = pair
    r = run_tallow(["run", "smollm2:135m", "hi", "--draft", str(draft)], home=default_home)
    err = r.stderr.decode()
    assert r.returncode == 1 and "cannot draft for" in err and "49152 tokens but the draft 275" in err, err


def test_a_draft_larger_than_the_target_is_refused(pair, default_home, default_model):
    target, _, _ = pair
    r = run_tallow(["run", str(target), "hi", "--draft", str(default_model)], home=default_home)
    err = r.stderr.decode()
    assert r.returncode == 1 and "is larger than the model it drafts for" in err, err


def test_draft_limits_are_checked(pair, tmp_path):
    target, draft, _ = pair
    r = run_tallow(["run", str(target), "hi", "--draft", str(draft), "--draft-min", "8", "--draft-max", "4"], home=tmp_path)
    assert r.returncode == 2 and "--draft-min 8 is more than --draft-max 4" in r.stderr.decode()


def test_the_length_follows_the_acceptance():
    assert best_length(0.95, 0.1, 16) >= 3  # a good, cheap draft drafts long
    assert best_length(0.95, 0.1, 16) > best_length(0.85, 0.1, 16) > 0
    assert best_length(0.3, 0.3, 16) == 0  # a poor one does not pay
    assert best_length(0.95, 0.1, 2) <= 2  # never past the room


def test_drafting_stops_when_enough_sequences_share_the_step():
    # a verified row costs 0.5 of a lone decode but more of each sequence's share of a busy step
    assert row_cost(1) == 0.5 and row_cost(8) == pytest.approx(8 / 9)
    assert best_length(0.9, 0.1, 16, busy=1) > best_length(0.9, 0.1, 16, busy=2) > 0
    assert best_length(0.9, 0.1, 16, busy=8) == 0
    assert best_length(0.99, 0.05, 16, busy=8) > 0  # an almost always right draft still pays


def lone_drafter(costs: StepCosts, acceptance: float = 0.2):
    from types import SimpleNamespace

    from tallow.runtime.drafting.draft_model import ModelDrafter, TenantPriors
    from tallow.runtime.types import DraftLimits

    owner = SimpleNamespace(limits=DraftLimits(), costs=costs, sequence=lambda seq: SimpleNamespace(kv=[]),
                            priors=TenantPriors())
    drafter = ModelDrafter(owner, 0, [])
    drafter.acceptance, drafter.first = acceptance, False  # past a request's first draft (always a probe)
    return drafter


def test_a_draft_that_cannot_pay_is_never_probed():
    from tallow.runtime.drafting.draft_model import PROBE_EVERY

    def probes(drafter, steps: int, right: bool = False) -> list[int]:
        """The steps (from 1) at which the drafter probes, each probe right or wrong as told."""
        seen = []
        for i in range(1, steps + 1):
            if drafter.length(64) == 1:
                assert drafter.probing  # a probe's one token is proposed whatever p_min says
                seen.append(i)
                drafter.outcome(int(right), 1)
                drafter.acceptance = 0.2  # it has been wrong: no length pays now
        return seen

    drafter = lone_drafter(StepCosts(0.1))
    # a cheap draft probes at once, then now and then, four times rarer each time a probe finds nothing
    assert probes(drafter, 7 * PROBE_EVERY) == [1, 1 + PROBE_EVERY, 1 + 5 * PROBE_EVERY]
    # a probe that was right is followed by another at the next step, while a draft could pay
    seen = probes(drafter, 16 * PROBE_EVERY, right=True)
    assert len(seen) >= 4 and seen[-4:] == [16 * PROBE_EVERY - i for i in (3, 2, 1, 0)]
    assert probes(drafter, 2 * PROBE_EVERY) == [1, 1 + PROBE_EVERY]  # wrong again: every PROBE_EVERY steps
    # measured up to sixteen rows: a draft token at 0.7 of a decode and each row at 0.5 would
    # not pay even if always right, so nothing is probed, right or not
    assert probes(lone_drafter(measured(plain=10.0, row=5.0, draft=7.0)), 8 * PROBE_EVERY, right=True) == []
    # where one right token does not pay but sixteen would, a right probe is followed at once
    costs = measured(plain=15.9, row=3.1, draft=6.6, catch_up=12.3)
    assert probes(lone_drafter(costs), 8, right=True) == list(range(1, 9))


def test_a_tenants_new_request_probes_again_as_soon_as_its_earlier_requests_drafts_paid():
    from types import SimpleNamespace

    from tallow.runtime.drafting.draft_model import PROBE_EVERY, ModelDrafter, TenantPriors
    from tallow.runtime.types import DraftLimits

    owner = SimpleNamespace(limits=DraftLimits(), costs=StepCosts(0.1), priors=TenantPriors(),
                            sequence=lambda seq: SimpleNamespace(kv=[]))
    first = ModelDrafter(owner, 0, [], tenant="a")
    assert first.prior is None and first.patience == PROBE_EVERY  # nothing known yet
    for _ in range(9):
        first.outcome(10, 10)  # runs of ten right guesses: nine tokens each past the first
    first.outcome(0, 10)
    first.extend(range(200))
    second = ModelDrafter(owner, 0, [], tenant="a")
    assert second.prior == 81 / 200 and second.patience == round(PROBE_EVERY * (1 - 2 * 81 / 200)) == 6
    assert ModelDrafter(owner, 1, [], tenant="b").patience == PROBE_EVERY  # never another tenant's
    second.outcome(0, 4)  # its opening guess is wrong: the next probe comes a few idle steps on
    assert second.probe_every == second.patience < PROBE_EVERY // 2
    for _ in range(20):
        second.outcome(1, 1)  # one right guess at a time saves no more than its catch-up: no runs
    second.extend(range(100))
    third = ModelDrafter(owner, 0, [], tenant="a")
    assert third.prior == (81 / 200 + 0) / 2  # the latest weighs half
    for _ in range(2):
        ModelDrafter(owner, 0, [], tenant="a").extend(range(100))  # two more requests with no runs
    seldom = ModelDrafter(owner, 0, [], tenant="a")
    # drafts that seldom paid: no probe at the first step (its window costs), one after the patience
    assert seldom.prior < 1 / 8 and seldom.patience > 3 * PROBE_EVERY // 4
    assert seldom.length(64) == 0 and not seldom.probing


def test_a_requests_first_draft_is_a_probe_from_a_window_of_its_prompt():
    drafter = lone_drafter(StepCosts(0.1), acceptance=0.95)
    drafter.first, drafter.history = True, list(range(100, 164))  # a 64-token prompt the cells do not hold
    assert drafter.length(64) == 1 and drafter.probing and drafter.window  # not all 64 caught up on
    assert drafter.length(64) > 1  # then the acceptance decides


def test_a_lucky_guess_the_draft_was_unsure_of_is_not_followed_by_another_probe():
    drafter = lone_drafter(StepCosts(0.1))
    assert drafter.length(64) == 1 and drafter.probing
    drafter.sure = False  # its guess was under p_min (DraftContext._extend marks it)
    drafter.outcome(1, 1)
    assert drafter.probe_every == drafter.patience > 1
    drafter.sure = True
    drafter.outcome(1, 1)
    assert drafter.probe_every == 1  # a sure guess that was right: look again at the next step


def test_a_probe_over_another_requests_cells_drafts_from_a_window():
    from tallow.runtime.drafting.draft_model import PROBE_WINDOW

    drafter = lone_drafter(StepCosts(0.1))
    drafter.history = list(range(100, 164))
    drafter.seq.kv = list(range(64))  # as long as the history, but another request's tokens (a window of it)
    assert drafter.length(64) == 1 and drafter.window  # not a catch-up of all 64 tokens
    drafter = lone_drafter(StepCosts(0.1))
    drafter.history = list(range(64))
    drafter.seq.kv = list(range(64 - PROBE_WINDOW))  # the same request's cells: only the gap is evaluated
    assert drafter.length(64) == 1 and not drafter.window


def measured(plain: float, row: float, draft: float, catch_up: float | None = None, longest: int = 16) -> StepCosts:
    """Costs as a lone sequence's timed calls give them (ms): a plain step, each verified row
    (timed at one and at `longest`), a draft call for a further token, and the catch-up call
    (by default the same)."""
    costs = StepCosts(0.36)
    for rows in (1, 2, 1 + longest):
        costs.target_step(1, rows, plain + (rows - 1) * row)
    costs.catch_up(1, draft if catch_up is None else catch_up)
    costs.draft_token(1, draft)
    return costs


def test_the_costs_are_measured_as_it_runs():
    costs = StepCosts(0.36)
    assert not costs.measured(1, 16) and costs.draft(1) == (0.36, 0.36) and costs.rows(1, 2) == 1.0  # the priors
    # an F16 target and its Q4_1 draft on 2 cores: rows cost less each the more there are
    # (17 rows: 4.2 decodes), and the draft's catch-up (two tokens) costs 0.77 of a decode
    for rows, ms in ((1, 15.9), (2, 21.3), (4, 30.1), (8, 41.3), (17, 67.0)):
        costs.target_step(1, rows, ms)
    costs.catch_up(1, 12.3)
    assert costs.rows(1, 1) == pytest.approx(5.4 / 15.9) and costs.rows(1, 16) == pytest.approx(51.1 / 15.9)
    assert costs.call_ms(12) == pytest.approx(41.3 + (67.0 - 41.3) * 4 / 9)  # between measured counts
    assert costs.call_ms(20) == pytest.approx(67.0 + 3 * (67.0 - 41.3) / 9)  # past them, at the last slope
    assert costs.draft(1) == pytest.approx((12.3 / 15.9, 12.3 / 15.9))  # a further token as the first, until timed
    costs.draft_token(1, 6.6)
    first, rest = costs.draft(1)
    assert rest == pytest.approx(6.6 / 15.9) and costs.measured(1, 16)
    # one drafted token does not pay, sixteen that are nearly always right do
    assert best_length(0.99, rest, 1, rows=lambda k: costs.rows(1, k), first=first) == 0
    assert best_length(0.99, rest, 16, rows=lambda k: costs.rows(1, k), first=first) >= 12
    # three sequences share a 30 ms step: until a draft call for three is timed, a lone one's
    # stands, unshared (10 ms each, so 1.23 of a share)
    costs.target_step(3, 3, 30.0)
    assert costs.draft(3)[0] == pytest.approx(12.3 * 3 / 30.0) and costs.measured(3, 16)
    costs.catch_up(3, 20.0)
    assert costs.draft(3)[0] == pytest.approx(20.0 / 30.0)
    # where rows cost little (a GPU), drafts grow longer than the CPU prior allows
    gpu = measured(plain=10.0, row=0.2, draft=1.0)
    assert best_length(0.9, gpu.draft(1)[1], 16, rows=lambda k: gpu.rows(1, k)) > best_length(0.9, 0.1, 16) > 0


def test_whole_steps_scale_what_the_calls_say():
    costs = measured(plain=16.0, row=4.0, draft=8.0)
    costs.whole_step(1, 16.0, 17.0)  # a plain step: 1 ms of sampling and Python around the call
    costs.drafting(8.0)  # a drafted step: the draft's 8 ms and 4 ms of a row more, but 18 ms beyond a plain one
    costs.whole_step(1, 20.0, 35.0)
    assert costs.scale == pytest.approx(1.1)  # from its prior of 1, a fifth of the way
    for _ in range(40):
        costs.drafting(8.0)
        costs.whole_step(1, 20.0, 35.0)
    assert costs.scale == pytest.approx(1.5, abs=1e-3) and costs.rows(1, 1) == pytest.approx(costs.scale * 4.0 / 16.0)
    before = costs.scale
    costs.drafting(8.0)
    costs.whole_step(1, None, 90.0)  # a step that evaluated a prompt too says nothing
    assert costs.scale == before and costs.pending_ms == 0.0


def test_a_lone_sequence_that_is_right_times_longer_drafts():
    costs = measured(plain=15.9, row=5.4, draft=11.0, longest=1)  # a row timed only once: it looks dear
    drafter = lone_drafter(costs, acceptance=0.95)
    lengths = []
    for _ in range(5):
        k = drafter.length(64)
        lengths.append(k)
        costs.target_step(1, 1 + k, 15.9 + 3.1 * k)  # the rows it verified, timed
    assert lengths[:4] == [3, 7, 15, 16]  # its reach doubles to the cap, then the times decide
    first, rest = costs.draft(1)
    assert lengths[4] == best_length(0.95, rest, 16, rows=lambda k: costs.rows(1, k), first=first) == 3
    assert lone_drafter(costs, acceptance=0.95).length(64, busy=2) < 16  # never explored with others in the step


def test_draft_auto_picks_a_small_stored_model_of_the_same_vocabulary(pair, tmp_path, monkeypatch):
    from tallow.models import draft_pick
    from tallow.models.resolve import locate
    from tallow.models.store import Store

    target, draft, folder = pair
    other_vocab = write_synthetic_gguf(folder / "wide.gguf", seed=5, extra_tokens=tuple(f"w{i}" for i in range(200)))
    for path, name in ((target, "t:big"), (draft, "d:small"), (other_vocab, "w:small")):
        done = run_tallow(["import", str(path), "--name", name], home=tmp_path)
        assert done.returncode == 0, done.stderr
    store = Store(tmp_path / "models")
    big = locate("t:big", store)
    assert draft_pick.pick_draft(big, store) is None  # the same size: not a small fraction
    monkeypatch.setattr(draft_pick, "SMALL_FRACTION", 1.0)
    picked = draft_pick.pick_draft(big, store)  # never the target itself, nor the wider vocabulary
    assert picked is not None and picked.name == "d:small"


def test_draft_auto_says_when_nothing_can_draft(default_home):
    r = run_tallow(["run", "smollm2:135m", "hi", "-n", "4", "--draft", "auto"], home=default_home)
    assert r.returncode == 0 and r.stdout.strip(), r.stderr.decode()
    assert "--draft auto: no stored model shares smollm2:135m's vocabulary" in r.stderr.decode()


def test_batch_drafts_every_sequence_and_answers_as_the_target(pair, tmp_path):
    target, draft, _ = pair
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": i, "messages": [{"role": "user", "content": f"hi {i}"}],
                                       "max_tokens": 24, "temperature": 0}) + "\n" for i in range(4)))

    def batch(name: str, *args: str) -> dict:
        out = tmp_path / name
        r = run_tallow(["batch", str(src), "-o", str(out), "--model", str(target), "--parallel", "4", *args],
                       home=tmp_path)
        assert r.returncode == 0, r.stderr.decode()
        return {rec["id"]: rec for rec in map(json.loads, out.read_text().splitlines())}

    alone = batch("plain.jsonl")
    drafted = batch("drafted.jsonl", "--draft", str(draft), "--draft-max", "4", "--draft-min", "4")
    for i in range(4):
        assert drafted[i]["text"] == alone[i]["text"] == "abcdefgh" * 3
        usage = drafted[i]["usage"]
        assert 0 < usage["accepted_tokens"] < usage["draft_tokens"]  # the draft is wrong after every "d"
        assert drafted[i]["draft"]["with"] == "draft.gguf" and "draft" not in alone[i]


def test_serve_drafts_for_its_first_model(pair, tmp_path):
    pytest.importorskip("openai")
    from helpers.server import Server

    target, draft, _ = pair
    server = Server(target, tmp_path, "--parallel", "2", "--draft", str(draft), "--draft-max", "4", "--draft-min", "4")
    try:
        client = server.client()
        for _ in range(2):  # the second request finds the draft's cells of the first
            r = client.chat.completions.create(model=target.name, max_tokens=20, temperature=0,
                                               messages=[{"role": "user", "content": "hi"}])
            assert r.choices[0].message.content == "abcdefgh" * 2 + "abcd"
            usage = r.usage.model_dump()
            # as in run, but the scheduler's room ends at max_tokens: the last step drafts only "cd"
            assert (usage["draft_tokens"], usage["accepted_tokens"]) == (18, 15), usage
            assert usage["draft"] == "draft.gguf"
        page = server.raw("/metrics")[2]
        assert 'tallow_draft_tokens_total{model="target.gguf"} 36' in page
        assert 'tallow_draft_accepted_tokens_total{model="target.gguf"} 30' in page
        # a request names the draft, or lookup, or is refused naming what this model drafts with
        named = client.chat.completions.create(model=target.name, max_tokens=20, temperature=0, extra_body={"draft": "draft.gguf"},
                                               messages=[{"role": "user", "content": "hi"}])
        assert named.usage.model_dump()["draft"] == "draft.gguf"
        lookup = client.chat.completions.create(model=target.name, max_tokens=20, temperature=0, extra_body={"draft": "lookup"},
                                                messages=[{"role": "user", "content": "hi"}])
        assert lookup.usage.model_dump().get("draft") in ("lookup", None)  # None: lookup found nothing to draft
        status, _, body = server.raw("/v1/chat/completions", json.dumps(
            {"model": target.name, "messages": [{"role": "user", "content": "hi"}], "draft": "other.gguf"}).encode(),
            {"Content-Type": "application/json"})
        assert status == 400 and body["error"]["param"] == "draft", body
        assert "drafts with draft.gguf, not 'other.gguf'" in body["error"]["message"]
    finally:
        server.close()


def test_serve_drafts_per_model(pair, tmp_path):
    pytest.importorskip("anthropic")
    import anthropic
    from helpers.server import Server

    target, draft, folder = pair
    other = write_synthetic_gguf(folder / "other.gguf", seed=5, script=TARGET)
    server = Server(target, tmp_path, str(other), "--model-option", f"{target} draft={draft}",
                    "--draft-max", "4", "--draft-min", "4")
    try:
        client = anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0)
        r = client.messages.create(model=target.name, max_tokens=20, extra_body={"temperature": 0},
                                   messages=[{"role": "user", "content": "hi"}])
        assert r.content[0].text == "abcdefgh" * 2 + "abcd"
        assert 'tallow_draft_accepted_tokens_total{model="target.gguf"} 15' in server.raw("/metrics")[2]
        with pytest.raises(anthropic.BadRequestError, match="is a file path; a request names a stored model"):
            client.messages.create(model=other.name, max_tokens=8, messages=[{"role": "user", "content": "hi"}],
                                   extra_body={"draft": "draft.gguf"})
    finally:
        server.close()


def test_a_request_names_a_stored_draft_and_the_runner_loads_it(pair, tmp_path, default_model):
    pytest.importorskip("openai")
    import openai
    from helpers.server import Server

    target, draft, _ = pair
    for model, name in ((draft, "drafty"), (default_model, "big")):
        assert run_tallow(["import", str(model), "--name", name, "--link"], home=tmp_path).returncode == 0
    server = Server(target, tmp_path, "--parallel", "2")  # served with no draft model
    try:
        client = server.client()
        ask = lambda draft_name: client.chat.completions.create(  # noqa: E731
            model=target.name, max_tokens=20, temperature=0, extra_body={"draft": draft_name},
            messages=[{"role": "user", "content": "hi"}])
        for name, refused in (("big", "is larger than the model it drafts for"), ("nowhere", "model .nowhere. not found"),
                              (str(draft), "is a file path")):
            with pytest.raises(openai.BadRequestError, match=refused):
                ask(name)
        for _ in range(2):  # loaded by the first request, found by the second
            r = ask("drafty")
            usage = r.usage.model_dump()
            assert r.choices[0].message.content == "abcdefgh" * 2 + "abcd"
            assert usage["draft"] == "drafty:latest" and usage["draft_tokens"] >= usage["accepted_tokens"] > 0, usage
        assert 'tallow_draft_accepted_tokens_total{model="target.gguf"}' in server.raw("/metrics")[2]
        with pytest.raises(openai.BadRequestError, match="drafts with drafty:latest, not 'big'"):
            ask("big")  # one draft model per served model
    finally:
        server.close()


def test_draft_limits_without_a_draft_model_are_refused(pair, tmp_path):
    target, _, _ = pair
    r = run_tallow(["run", str(target), "hi", "--draft-max", "4"], home=tmp_path)
    assert r.returncode == 2 and "give --draft MODEL" in r.stderr.decode()


@pytest.fixture(scope="module")
def q8_home(tmp_path_factory, default_model) -> Path:
    """The default model (Q4_1) stored as smol:q41, and a Q8_0 copy of it (smol:q8) for it to draft for."""
    home = tmp_path_factory.mktemp("q8-home")
    for args in (["import", str(default_model), "--name", "smol:q41"],
                 ["quantize", "smol:q41", "--type", "Q8_0", "--allow-requantize", "--name", "smol:q8"]):
        done = run_tallow(args, home=home)
        assert done.returncode == 0, done.stderr.decode()
    return home


COUNT = "Count from 1 to 30, separated by commas."


def test_the_default_model_drafts_for_a_larger_copy_of_itself(q8_home):
    from helpers.agree import agree_or_tie

    args = ["run", "smol:q8", COUNT, "-n", "32", "--temperature", "0", "--json", "--logprobs", "2", "--flash-attn", "on",
            "--no-cache"]
    plain = _json(run_tallow(args, home=q8_home))
    drafted = _json(run_tallow([*args, "--draft", "smol:q41", "--draft-min", "2"], home=q8_home))
    agree_or_tie(plain, drafted)
    u = drafted["usage"]
    assert u["draft"] == "smol:q41" and u["draft_tokens"] >= 16 and u["accepted_tokens"] > u["draft_tokens"] / 2, u


def test_eight_streams_draft_and_answer_as_without(q8_home, tmp_path):
    from helpers.agree import agree_or_tie

    src = tmp_path / "in.jsonl"
    topics = ["1 to 30", "10 to 40", "the letters A to P", "5 to 50 in fives", "2 to 40 in twos", "20 down to 1",
              "the days of the week", "the months of the year"]
    src.write_text("".join(json.dumps({"id": i, "messages": [{"role": "user", "content": f"List {t}, separated by commas."}],
                                       "max_tokens": 24, "temperature": 0, "logprobs": True, "top_logprobs": 2}) + "\n"
                           for i, t in enumerate(topics)))

    def batch(name: str, *args: str) -> dict:
        out = tmp_path / name
        r = run_tallow(["batch", str(src), "-o", str(out), "--model", "smol:q8", "--parallel", "8", "--flash-attn", "on",
                        "--no-cache", *args], home=q8_home, timeout=600)
        assert r.returncode == 0, r.stderr.decode()
        return {rec["id"]: rec for rec in map(json.loads, out.read_text().splitlines())}

    plain = batch("plain.jsonl")
    drafted = batch("drafted.jsonl", "--draft", "smol:q41", "--draft-min", "2")
    for i in range(len(topics)):
        agree_or_tie(plain[i], drafted[i])
    assert sum(r["usage"]["accepted_tokens"] for r in drafted.values()) > 0


def _json(done) -> dict:
    assert done.returncode == 0, done.stderr.decode()
    return json.loads(done.stdout)


def test_a_draft_that_does_not_fit_next_to_the_target_is_refused_before_loading(q8_home):
    from tallow.models.resolve import locate
    from tallow.models.store import Store
    from tallow.runtime.backend import supports_gpu_offload
    from tallow.runtime.engine import Engine
    from tallow.runtime.errors import DraftError
    from tallow.runtime.loadplan import plan_memory
    from tallow.runtime.types import LoadSettings

    store = Store(q8_home / "models")
    target, draft = locate("smol:q8", store).paths, locate("smol:q41", store).paths
    alone = plan_memory(target, LoadSettings(n_ctx=2048, n_threads=2), supports_gpu_offload(), None).estimate.ram
    room = alone + 40 * 10**6  # the target fits, a 98 MB draft next to it does not
    with pytest.raises(DraftError, match=r"the draft smol:q41 does not fit next to the model: .*needs"):
        Engine(target, LoadSettings(n_ctx=2048, n_threads=2, memory=room, draft=tuple(draft), draft_name="smol:q41"))
    with Engine(target, LoadSettings(n_ctx=2048, n_threads=2, memory=room + 400 * 10**6, draft=tuple(draft))) as engine:
        assert engine.drafts is not None  # with room for both, both load


def test_a_draft_on_an_embedding_model_is_refused(minilm_model, pair):
    from tallow.runtime.engine import Engine
    from tallow.runtime.errors import DraftError
    from tallow.runtime.types import LoadSettings

    _, draft, _ = pair
    with pytest.raises(DraftError, match="an embedding model writes none"):
        Engine(minilm_model, LoadSettings(n_threads=2, embeddings=True, pooling="mean", draft=(draft,)))
