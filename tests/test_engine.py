"""The engine on the tiny synthetic model: detokenization, stops, usage, reuse, interrupts."""

from __future__ import annotations

import pytest

from tallow.runtime.errors import ContextOverflow, TemplateError
from tallow.runtime.types import FinalEvent, Request, Sampling, TokenEvent

# Sample from the whole random distribution so every kind of token turns up.
WILD = Sampling(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=7)


def collect(engine, request):
    tokens, texts, final = [], [], None
    for ev in engine.stream(request):
        if isinstance(ev, TokenEvent):
            tokens.append(ev.token)
            texts.append(ev.text)
        else:
            final = ev
    return tokens, "".join(texts) + final.tail, final


def prompt(engine, text="hello there"):
    return engine.prompt_for([{"role": "user", "content": text}])


def test_long_output_detokenizes_like_the_whole_sequence(synth_engine):
    # seed 3 draws the 64-byte token and many bytes of split multi-byte characters
    sampling = Sampling(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=3)
    tokens, streamed, final = collect(synth_engine, Request(prompt(synth_engine), 400, (), sampling, ignore_eos=True))
    assert final.finish_reason == "length" and len(tokens) == 400
    pieces = [synth_engine.model.piece(t) for t in tokens]
    assert max(len(p) for p in pieces) == 64
    assert sum(1 for p in pieces if p and p[0] >= 0x80) > 50
    whole = synth_engine.model.detokenize(tokens).decode("utf-8", errors="replace")
    assert streamed == final.text == whole
    assert b"".join(pieces).decode("utf-8", errors="replace") == whole


def test_pieces_longer_than_32_bytes_are_kept(synth_engine):
    long_token = synth_engine.tokenize("=" * 64)
    assert len(long_token) == 1
    assert synth_engine.model.piece(long_token[0]) == b"=" * 64


def test_usage_and_timings_are_consistent(synth_engine):
    p = prompt(synth_engine)
    tokens, _, final = collect(synth_engine, Request(p, 25, (), WILD, ignore_eos=True))
    u, t = final.usage, final.timings
    assert u.prompt_tokens == len(p)
    assert u.completion_tokens == len(tokens) == t.decode_tokens == 25
    assert u.cached_tokens + t.prefill_tokens == u.prompt_tokens
    assert len(t.itl_ms) == 24 and all(g > 0 for g in t.itl_ms)
    assert 0 < t.prefill_ms <= t.ttft_ms <= t.total_ms
    assert t.itl_percentile(50) <= t.itl_percentile(95) <= max(t.itl_ms)


def test_same_seed_same_text_and_greedy_is_deterministic(synth_engine):
    p = prompt(synth_engine)
    a = collect(synth_engine, Request(p, 60, (), WILD))[1]
    b = collect(synth_engine, Request(p, 60, (), WILD))[1]
    c = collect(synth_engine, Request(p, 60, (), Sampling(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=8)))[1]
    assert a == b != c
    g1 = collect(synth_engine, Request(p, 60, (), Sampling(temperature=0)))[1]
    g2 = collect(synth_engine, Request(p, 60, (), Sampling(temperature=0)))[1]
    assert g1 == g2


def test_stop_strings_never_leak_and_end_the_answer(synth_engine):
    p = prompt(synth_engine)
    _, free_text, _ = collect(synth_engine, Request(p, 200, (), Sampling(temperature=0), ignore_eos=True))
    stop = free_text[40:43]
    assert len(stop) == 3
    tokens, text, final = collect(synth_engine, Request(p, 200, (stop,), Sampling(temperature=0), ignore_eos=True))
    assert final.finish_reason == "stop"
    assert stop not in text
    assert text == final.text == free_text[: free_text.index(stop)]


def test_second_request_reuses_the_common_prefix(synth_engine):
    p = prompt(synth_engine, "a shared beginning, then one ending")
    q = prompt(synth_engine, "a shared beginning, then another")
    collect(synth_engine, Request(p, 5, (), WILD))
    _, _, final = collect(synth_engine, Request(q, 5, (), WILD))
    common = next(i for i, (a, b) in enumerate(zip(p, q)) if a != b)
    assert final.usage.cached_tokens == common
    assert final.timings.prefill_tokens == len(q) - common
    # the identical prompt again: everything but the last token comes from cache
    _, _, again = collect(synth_engine, Request(q, 5, (), WILD))
    assert again.usage.cached_tokens == len(q) - 1


def test_reuse_does_not_change_the_answer(synth_engine):
    p = prompt(synth_engine, "determinism with and without cache")
    greedy = Sampling(temperature=0)
    first = collect(synth_engine, Request(p, 40, (), greedy))[1]
    collect(synth_engine, Request(prompt(synth_engine, "something else"), 3, (), greedy))
    assert collect(synth_engine, Request(p, 40, (), greedy))[1] == first


def test_prompt_longer_than_context_names_both_counts(synth_engine):
    p = synth_engine.tokenize("hello " * 600)
    assert len(p) > synth_engine.n_ctx
    with pytest.raises(ContextOverflow, match=rf"{len(p)} tokens.*holds {synth_engine.n_ctx}"):
        list(synth_engine.stream(Request(p, 5)))


def test_answer_stops_when_the_context_is_full(synth_engine):
    p = synth_engine.tokenize("x" * 10)[: synth_engine.n_ctx - 10]
    p = (p * 100)[: synth_engine.n_ctx - 10]
    tokens, _, final = collect(synth_engine, Request(p, None, (), WILD, ignore_eos=True))
    assert final.finish_reason == "length"
    assert len(p) + len(tokens) == synth_engine.n_ctx + 1  # the last token is sampled, never decoded


def test_interrupt_from_the_consumer_yields_the_final_record(synth_engine):
    events = synth_engine.stream(Request(prompt(synth_engine), 100, (), WILD, ignore_eos=True))
    seen = [next(events) for _ in range(5)]
    final = events.throw(KeyboardInterrupt)
    assert isinstance(final, FinalEvent)
    assert final.finish_reason == "interrupted"
    assert final.usage.completion_tokens == 5
    assert final.text.startswith("".join(e.text for e in seen))
    # the engine goes on working afterwards
    assert collect(synth_engine, Request(prompt(synth_engine), 3, (), WILD, ignore_eos=True))[2].finish_reason == "length"


def test_hostile_template_is_refused_without_running_code(synth_engine):
    from tallow.runtime.template import ChatTemplate

    escape = "{{ ''.__class__.__mro__[1].__subclasses__() }}"
    with pytest.raises(TemplateError, match="unsafe or too expensive"):
        ChatTemplate(escape, "", "").render([{"role": "user", "content": "hi"}])
    huge = "{% for i in range(100000) %}{% for j in range(100000) %}xxxxxxxx{% endfor %}{% endfor %}"
    with pytest.raises(TemplateError, match="unsafe or too expensive"):
        ChatTemplate(huge, "", "").render([])


def test_template_renders_chatml(synth_engine):
    text = synth_engine.chat_template().render([{"role": "user", "content": "hi"}])
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("sampling", [Sampling(temperature=0), Sampling(temperature=0, repeat_penalty=1.3)])
def test_lookup_drafts_never_change_a_greedy_answer(synth_engine, sampling):
    # a prompt full of repeats, so the n-gram lookup has drafts to offer
    p = synth_engine.tokenize("the cat sat on the mat. the cat sat on the mat. the cat sat on the " * 3)
    plain = collect(synth_engine, Request(p, 150, (), sampling, ignore_eos=True))
    fast = collect(synth_engine, Request(p, 150, (), sampling, ignore_eos=True, draft="lookup"))
    assert fast[0] == plain[0] and fast[1] == plain[1]
    u = fast[2].usage
    assert u.completion_tokens == 150 and 0 <= u.accepted_tokens <= u.draft_tokens
    # the KV cache holds exactly what plain decoding leaves: a follow-up reuses it all
    follow = collect(synth_engine, Request(p + fast[0][:-1] + [65], 2, (), sampling))
    assert follow[2].usage.cached_tokens == len(p) + 149


def test_lookup_accepts_drafts_when_the_answer_repeats(tmp_path):
    from helpers.synth import write_synthetic_gguf

    from tallow.runtime.engine import Engine
    from tallow.runtime.types import LoadSettings

    path = write_synthetic_gguf(tmp_path / "loop.gguf", script={"\n": "a", "a": "b", "b": "c", "c": "a"})
    with Engine(path, LoadSettings(n_ctx=512, n_threads=2)) as engine:
        p = engine.tokenize("abcabc\n")
        plain = collect(engine, Request(p, 100, (), Sampling(temperature=0)))
        fast = collect(engine, Request(p, 100, (), Sampling(temperature=0), draft="lookup"))
        assert fast[1] == plain[1] == ("abc" * 34)[:100]
        u = fast[2].usage
        assert u.accepted_tokens > 60 and u.accepted_tokens >= 0.8 * u.draft_tokens  # nearly every guess right
        assert fast[2].finish_reason == "length"
        # a prompt whose n-grams lead astray ("cab" was followed by "d"): drafts are rejected,
        # the wrong cells dropped, and the answer is still the plain one
        p = engine.tokenize("abcabdabcabdabcabd\n")
        plain = collect(engine, Request(p, 60, (), Sampling(temperature=0)))
        fast = collect(engine, Request(p, 60, (), Sampling(temperature=0), draft="lookup"))
        assert fast[1] == plain[1]
        u = fast[2].usage
        assert 0 < u.accepted_tokens < u.draft_tokens


def test_prompt_progress_is_reported_after_each_chunk_before_the_first_token(synth_model):
    from tallow.runtime.engine import Engine
    from tallow.runtime.types import LoadSettings, ProgressEvent

    with Engine(synth_model, LoadSettings(n_ctx=512, n_threads=2, n_batch=64)) as engine:
        p = engine.tokenize("the cat sat on the mat. " * 30)[:200]
        events = list(engine.stream(Request(p, 2, (), Sampling(temperature=0), progress=True)))
        quiet = list(engine.stream(Request(p, 2, (), Sampling(temperature=0))))
    reports = [e for e in events if isinstance(e, ProgressEvent)]
    assert [r.processed for r in reports] == [64, 128, 192, 200] and {(r.total, r.cached) for r in reports} == {(200, 0)}
    assert all(isinstance(e, ProgressEvent) for e in events[:4]) and isinstance(events[4], TokenEvent)
    assert not any(isinstance(e, ProgressEvent) for e in quiet)  # only when asked
