"""Conversations on scripted synthetic models: KV reuse per turn, reasoning, overflow, interrupts."""

from __future__ import annotations

import pytest
from helpers.synth import write_synthetic_gguf

from tallow.common.fields import BY_NAME
from tallow.runtime.chat import ChatSettings, Conversation
from tallow.runtime.engine import Engine
from tallow.runtime.errors import ContextOverflow
from tallow.runtime.types import FinalEvent, LoadSettings, NoticeEvent, Sampling, TokenEvent

GREEDY = Sampling(temperature=0)
OK_SCRIPT = {"\n": "O", "O": "K", "K": "<|im_end|>"}
THINK_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n<think>\\n' }}{% endif %}{# </think> #}"
)
THINK_SCRIPT = {"\n": "h", "h": "m", "m": "</think>", "</think>": "O", "O": "K", "K": "<|im_end|>"}


@pytest.fixture(scope="module")
def ok_engine(tmp_path_factory):
    path = write_synthetic_gguf(tmp_path_factory.mktemp("ok") / "ok.gguf", script=OK_SCRIPT)
    with Engine(path, LoadSettings(n_ctx=512, n_threads=2)) as engine:
        yield engine


@pytest.fixture(scope="module")
def think_engine(tmp_path_factory):
    path = write_synthetic_gguf(tmp_path_factory.mktemp("think") / "think.gguf", script=THINK_SCRIPT,
                                template=THINK_TEMPLATE)
    with Engine(path, LoadSettings(n_ctx=512, n_threads=2)) as engine:
        yield engine


def turn(conv: Conversation, text: str) -> FinalEvent:
    events = list(conv.ask(text))
    return events[-1]


def test_each_turn_evaluates_only_the_new_tokens(ok_engine):
    ok_engine.reset()
    conv = Conversation(ok_engine, ChatSettings(GREEDY, max_tokens=20), system="Be brief.")
    first = turn(conv, "hello there")
    assert first.text == "OK" and first.usage.cached_tokens == 0
    for message in ("a second message", "and a third, a little longer than the others"):
        before = first.usage.prompt_tokens
        final = turn(conv, message)
        new = ok_engine.tokenize(f"<|im_end|>\n<|im_start|>user\n{message}<|im_end|>\n<|im_start|>assistant\n", special=True)
        assert final.timings.prefill_tokens == len(new)  # the answer's end marker, the message, the header
        assert final.usage.cached_tokens == final.usage.prompt_tokens - len(new) > before
        first = final
    assert conv.summary()["turns"] == 3


def test_reasoning_is_counted_apart_and_never_fed_back(think_engine):
    think_engine.reset()
    conv = Conversation(think_engine, ChatSettings(GREEDY, max_tokens=20))
    events = list(conv.ask("hi"))
    final = events[-1]
    assert final.text == "OK" and final.reasoning == "hm"
    assert final.usage.reasoning_tokens == 3 and final.usage.completion_tokens == 5  # h, m, </think> | O, K
    assert "".join(e.reasoning for e in events if isinstance(e, TokenEvent)) == "hm"
    assert conv.messages[-1] == {"role": "assistant", "content": "OK", "reasoning_content": "hm"}
    second = turn(conv, "again")
    rendered = think_engine.model.detokenize(think_engine.request(conv._all([])).prompt_tokens).decode()
    assert "hm" not in rendered
    # The template re-renders turn 1 without its reasoning, so reuse stops where the text
    # diverges (the "<think>\n" the generation prompt had opened), and the stats say so.
    assert second.usage.cached_tokens == final.usage.prompt_tokens - 2


def test_a_full_context_drops_the_oldest_turns_with_a_notice(ok_engine):
    ok_engine.reset()
    conv = Conversation(ok_engine, ChatSettings(GREEDY, max_tokens=8), system="sys")
    long = "word " * 60
    notices = []
    for _ in range(6):
        notices += [e for e in conv.ask(long) if isinstance(e, NoticeEvent)]
    assert notices and "dropped the oldest" in notices[0].message
    assert conv.system == "sys" and len(conv.messages) < 12
    strict = Conversation(ok_engine, ChatSettings(GREEDY, max_tokens=8, on_overflow="error"))
    with pytest.raises(ContextOverflow, match="context holds 512"):
        for _ in range(6):
            turn(strict, long)


def test_ctrl_c_keeps_the_partial_answer_and_the_chat_goes_on(tmp_path):
    path = write_synthetic_gguf(tmp_path / "loop.gguf", script={"\n": "a", "a": "b", "b": "a"})
    with Engine(path, LoadSettings(n_ctx=512, n_threads=2)) as engine:
        conv = Conversation(engine, ChatSettings(GREEDY, max_tokens=300))
        events = conv.ask("go")
        for _ in range(10):
            next(events)
        final = events.throw(KeyboardInterrupt)
        assert final.finish_reason == "interrupted" and final.text == "ab" * 5
        assert conv.messages[-1] == {"role": "assistant", "content": "ab" * 5, "cut": True}
        assert turn(conv, "more").finish_reason == "length"


def test_set_save_and_load(ok_engine, tmp_path):
    conv = Conversation(ok_engine, ChatSettings(GREEDY, max_tokens=20), system="s")
    conv.set("temperature", "0.5")
    conv.set("max-tokens", "7")
    assert conv.settings.sampling.temperature == 0.5 and conv.settings.max_tokens == 7
    for word in BY_NAME["max_tokens"].off["set"]:  # the row's words for "no limit of the chat's own"
        conv.set("max_tokens", "7")
        conv.set("max_tokens", word)
        assert conv.settings.max_tokens is None
    with pytest.raises(ValueError, match="temperature wants a number, not 'off'"):
        conv.set("temperature", "off")
    conv.set("max-tokens", "7")
    with pytest.raises(ValueError, match="unknown setting"):
        conv.set("nonsense", "1")
    with pytest.raises(ValueError, match="top_k wants a whole number"):
        conv.set("top_k", "many")
    turn(conv, "remember me")
    conv.save(tmp_path / "c.json")
    other = Conversation(ok_engine, ChatSettings(GREEDY))
    other.load(tmp_path / "c.json")
    assert other.system == "s" and other.messages == conv.messages
    (tmp_path / "bad.json").write_text('{"messages": [{"role": "wizard", "content": 1}]}')
    with pytest.raises(ValueError):
        other.load(tmp_path / "bad.json")


def test_hide_thinking_shows_only_the_answer(capsys):
    import io

    from rich.console import Console

    from tallow.cli.commands.chat import _show

    shown = io.StringIO()
    _show(Console(file=shown, color_system=None), "answer", "private reasoning", hide_thinking=False)
    assert shown.getvalue() == "private reasoning" and capsys.readouterr().out == "answer"
    hidden = io.StringIO()
    _show(Console(file=hidden, color_system=None), "answer", "private reasoning", hide_thinking=True)
    assert hidden.getvalue() == "" and capsys.readouterr().out == "answer"


def test_chat_through_pipes_has_no_stats_line_unless_asked_and_load_errors_have_a_hint(synth_model, tmp_path):
    from helpers.processes import run_tallow

    script = b"hello\n/load nosuch\n/save kept\n/load nosuch\n/bye\n"
    plain = run_tallow(["chat", str(synth_model), "--max-tokens", "3", "--no-log"], home=tmp_path, input=script)
    err = plain.stderr.decode()
    assert plain.returncode == 0, err
    assert "TTFT" not in err  # stderr is a pipe: no stats line, as for run
    assert "error: no saved conversation 'nosuch'" in err and "[Errno" not in err
    assert "hint: none is saved yet: /save NAME keeps this one" in err
    assert "hint: saved ones: kept" in err  # after /save, the hint lists what there is
    forced = run_tallow(["chat", str(synth_model), "--max-tokens", "3", "--no-log", "--stats"], home=tmp_path,
                        input=b"hello\n/bye\n")
    assert forced.returncode == 0 and "TTFT" in forced.stderr.decode()


def test_a_chat_with_a_disk_cache_never_splits_off_the_last_prompt_token(synth_model, tmp_path):
    """Only a prompt that will be saved whole has its last token evaluated alone; a chat saves
    only its system prompt."""
    from tallow.runtime.prompt_cache import PromptCache

    cache = PromptCache(tmp_path / "cache", 1 << 30, min_tokens=16)
    with Engine(synth_model, LoadSettings(n_ctx=512, n_threads=2)) as engine:
        engine.use_prompt_cache(cache, "synthetic-digest")
        calls = []
        decode = engine.ctx.decode
        engine.ctx.decode = lambda tokens, *a, **kw: (calls.append(len(tokens)), decode(tokens, *a, **kw))[1]
        conv = Conversation(engine, ChatSettings(GREEDY, max_tokens=3), system="You answer questions about documents.")
        final = turn(conv, " ".join(f"line {i} of a document." for i in range(8)))
        assert final.timings.prefill_tokens > 16
        # the prompt in two batches, no lone last token: up to the system prompt (a cache point,
        # saved right there), then the rest
        first_turn = calls[:2]
        assert sum(first_turn) == final.timings.prefill_tokens and min(first_turn) > 1
        request = engine.request([{"role": "user", "content": "x " * 40}], max_tokens=2, sampling=GREEDY)
        engine.reset()
        calls.clear()
        list(engine.stream(request))
        assert calls[:2] == [len(request.prompt_tokens) - 1, 1]  # a run's prompt, to be saved: split
        head = [{"role": "system", "content": conv.system}]
        system = engine.request(head + [{"role": "user", "content": "?"}], cache_prefixes=[head])
    # the chat saved its system prompt (a cache point, once) and never a whole prompt
    (entry,) = cache.entries()
    assert len(entry.tokens) == system.cache_points[0] == first_turn[0] < final.usage.prompt_tokens
