"""Recurrent models keep their cache: state checkpoints where turns begin, restored when a
prompt parts from what the sequence holds (runtime/checkpoints.py). The model is a tiny
synthetic Mamba whose state depends on every token it read, so an answer from a wrongly
restored state differs from the answer of a full re-prefill, which each test compares with."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.synth import write_synthetic_mamba

from tallow.runtime.checkpoints import Checkpoints
from tallow.runtime.engine import Engine
from tallow.runtime.errors import DraftError
from tallow.runtime.prompt_cache import PromptCache
from tallow.runtime.types import FinalEvent, LoadSettings, Request, Sampling

GREEDY = Sampling(temperature=0)


@pytest.fixture(scope="module")
def mamba(tmp_path_factory):
    return write_synthetic_mamba(tmp_path_factory.mktemp("mamba") / "mamba.gguf")


def settings(**kw) -> LoadSettings:
    return LoadSettings(n_ctx=2048, n_threads=2, **kw)


def final_of(engine, request: Request) -> FinalEvent:
    return [e for e in engine.stream(request) if isinstance(e, FinalEvent)][0]


def from_scratch(engine, request: Request) -> FinalEvent:
    engine.reset()
    return final_of(engine, request)


def test_a_restored_checkpoint_gives_the_state_it_saved(mamba, synth_model):
    tokens = list(range(40, 90))
    with Engine(mamba, settings()) as engine:
        seq, ctx, n_vocab = engine.sequence, engine.ctx, engine.model.n_vocab
        assert not ctx.rewinds and seq.checkpoints is not None
        ctx.decode(tokens, 0)
        seq.kv.extend(tokens)
        whole = ctx.logit_row(-1, n_vocab)
        assert seq.keep(30) == 0 and seq.kv == []  # no checkpoint: cleared, never a wrong state
        for a, b in [(0, 10), (10, 20)]:
            ctx.decode(tokens[a:b], a)
            seq.kv.extend(tokens[a:b])
            seq.mark()
        ctx.decode(tokens[20:], 20)
        seq.kv.extend(tokens[20:])
        assert seq.checkpoints.lengths() == [10, 20]
        assert seq.keep(35) == 20 and seq.kv == tokens[:20]  # the longest checkpoint up to 35
        ctx.decode(tokens[20:], 20)
        np.testing.assert_array_equal(ctx.logit_row(-1, n_vocab), whole)
    with Engine(synth_model, settings()) as engine:  # attention cells are cut back as before
        assert engine.ctx.rewinds and engine.sequence.checkpoints is None


def test_a_ten_turn_chat_and_an_edit_resume_from_checkpoints(mamba):
    messages = [{"role": "system", "content": "You answer in one line."}]
    with Engine(mamba, settings()) as engine, Engine(mamba, settings()) as scratch:
        previous = 0
        for turn in range(10):
            messages.append({"role": "user", "content": f"Question {turn}: what is {turn} and {turn}?"})
            request = engine.request(messages, max_tokens=8, sampling=GREEDY)
            final = final_of(engine, request)
            assert final.text == from_scratch(scratch, scratch.request(messages, max_tokens=8, sampling=GREEDY)).text
            # everything up to the last turn's answer came from a checkpoint (its text is
            # not the tokens sampled, so the answer itself is evaluated again)
            assert final.usage.cached_tokens >= previous - 1 and (final.usage.cached_tokens > 0) == (turn > 0)
            assert request.turns[-1] > previous
            previous = len(request.prompt_tokens)
            messages.append({"role": "assistant", "content": final.text})
        held = engine.sequence.checkpoints.lengths()
        assert len(held) == 8 and held[0] < previous // 4  # spread over the conversation
        messages[5] = {"role": "user", "content": "An edited question, in the third turn."}
        edited = engine.request(messages[:-1], max_tokens=8, sampling=GREEDY)
        final = final_of(engine, edited)
        start = engine.request(messages[:5], max_tokens=1).turns[-1]  # where the edited turn begins
        assert 0 < final.usage.cached_tokens <= start and final.usage.cached_tokens in held
        assert final.text == from_scratch(scratch, edited).text


def test_serving_slots_keep_their_own_checkpoints(mamba):
    from tallow.runtime.scheduling.scheduler import Scheduler, SchedulerSettings

    sched = Scheduler.load([mamba], settings(), SchedulerSettings(parallel=2))
    talks = [[{"role": "user", "content": f"Conversation {n}, first turn."}] for n in range(2)]
    answers: list[list[FinalEvent]] = [[], []]
    try:
        for _ in range(3):
            for n, talk in enumerate(talks):  # the two alternate: each slot resumes its own
                request = sched.engine.request(talk, max_tokens=6, sampling=GREEDY)
                final = [e for e in sched.submit(request).events() if isinstance(e, FinalEvent)][0]
                answers[n].append(final)
                talk += [{"role": "assistant", "content": final.text}, {"role": "user", "content": "And then?"}]
    finally:
        sched.close()
    with Engine(mamba, settings()) as scratch:
        for n, talk in enumerate(talks):
            for k, final in enumerate(answers[n]):
                expected = from_scratch(scratch, scratch.request(talk[:2 * k + 1], max_tokens=6, sampling=GREEDY))
                assert final.text == expected.text
                assert (final.usage.cached_tokens > 0) == (k > 0)


def test_several_answers_fork_one_recurrent_state(mamba, tmp_path):
    # run --n evaluates the prompt once and copies the state to each answer's sequence
    import json

    from helpers.processes import run_tallow

    args = ["run", str(mamba), "A prompt whose state every answer starts from.", "-n", "8", "--temperature", "0",
            "--json", "--offline"]
    many = run_tallow([*args, "--n", "3"], home=tmp_path)
    one = run_tallow(args, home=tmp_path)
    assert many.returncode == one.returncode == 0, many.stderr.decode() + one.stderr.decode()
    texts = [c["text"] for c in json.loads(many.stdout)["choices"]]
    assert texts == [json.loads(one.stdout)["text"]] * 3


def test_a_saved_prefix_loads_into_a_recurrent_state(mamba, tmp_path):
    cache = PromptCache(tmp_path / "cache", 1 << 30, min_tokens=16)
    system = [{"role": "system", "content": "A system prompt long enough to be worth saving on disk."}]
    messages = system + [{"role": "user", "content": "What follows?"}]
    with Engine(mamba, settings()) as first:
        first.use_prompt_cache(cache, "mamba")
        request = first.request(messages, cache_prefixes=[system], max_tokens=8, sampling=GREEDY)
        a = final_of(first, request)
        assert first.save_prompt(request) >= 1
    with Engine(mamba, settings()) as second:  # as far as the cache goes, another process
        second.use_prompt_cache(cache, "mamba")
        again = second.request(messages, cache_prefixes=[system], max_tokens=8, sampling=GREEDY)
        b = final_of(second, again)
        other = second.request(system + [{"role": "user", "content": "Something else entirely?"}],
                               cache_prefixes=[system], max_tokens=8, sampling=GREEDY)
        c = final_of(second, other)
        assert c.text == from_scratch(second, other).text
    assert b.usage.cache_source == "disk" and b.usage.cached_tokens == len(again.prompt_tokens) - 1
    assert b.text == a.text
    assert c.usage.cached_tokens == other.cache_points[0] > 0


def test_drafts_are_refused_or_left_out_for_a_recurrent_state(mamba, synth_model):
    messages = [{"role": "user", "content": "Repeat: one two three one two three one two three"}]
    with Engine(mamba, settings()) as engine:
        final = final_of(engine, engine.request(messages, max_tokens=12, sampling=GREEDY, draft="lookup"))
        assert final.usage.draft_tokens == 0 and final.usage.draft is None
        assert final.text == from_scratch(engine, engine.request(messages, max_tokens=12, sampling=GREEDY)).text
    with pytest.raises(DraftError, match="recurrent layers"):
        Engine(mamba, settings(draft=(synth_model,)))
    with pytest.raises(DraftError, match="recurrent layers"):
        Engine(synth_model, settings(draft=(mamba,)))


def test_checkpoints_forget_the_closest_but_never_the_turn_in_progress():
    held = Checkpoints(limit=4)
    for n in (40, 100, 110, 200):
        held.add(n, b"x")
    held.add(300, b"y")  # full: 100 goes, its neighbours the closest (40 and 110); 200 and 300 stay
    assert held.lengths() == [40, 110, 200, 300]
    held.add(301, b"z")  # then 40 (between 0 and 110), not 200 (110 to 300) nor the turn's two
    assert held.lengths() == [110, 200, 300, 301]
    assert held.best(250) == (200, b"x") and held.best(5) is None
    held.drop_after(200)
    assert held.lengths() == [110, 200]
