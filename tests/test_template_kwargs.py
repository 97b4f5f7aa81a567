"""chat_template_kwargs reach the chat template: a model whose template ends its prompt with
"a" unless enable_thinking is false (then "b"), and whose weights answer "x" after "a" and
"y" after "b", answers by what the request set."""

from __future__ import annotations

import openai
import pytest
from helpers.server import Server
from helpers.synth import write_synthetic_gguf

TEMPLATE = ("{% for m in messages %}{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}"
            "{% if enable_thinking is defined and not enable_thinking %}b{% else %}a{% endif %}{% endif %}")


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    d = tmp_path_factory.mktemp("kwargs")
    model = write_synthetic_gguf(d / "switch.gguf", template=TEMPLATE, script={"a": "x", "x": "x", "b": "y", "y": "y"})
    s = Server(model, d / "home")
    yield openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0)
    s.close()


def _ask(client, **extra) -> str:
    return client.chat.completions.create(model="switch.gguf", messages=[{"role": "user", "content": "hi"}],
                                          max_tokens=3, temperature=0, **extra).choices[0].message.content


def test_the_template_reads_what_the_request_sets(client):
    assert _ask(client) == "xxx"
    assert _ask(client, extra_body={"chat_template_kwargs": {"enable_thinking": False}}) == "yyy"
    assert _ask(client, extra_body={"chat_template_kwargs": {"enable_thinking": True}}) == "xxx"


def test_a_name_the_template_never_reads_is_refused_by_name(client):
    with pytest.raises(openai.BadRequestError, match="never reads 'reasoning_level' \\(it reads enable_thinking\\)"):
        _ask(client, extra_body={"chat_template_kwargs": {"reasoning_level": "high"}})
    assert _ask(client, extra_body={"chat_template_kwargs": {"enable_thinking": False}}) == "yyy"  # still served


def test_what_tallow_gives_the_template_cannot_be_overridden(client):
    for bad in ({"messages": []}, {"add_generation_prompt": False}, ["enable_thinking"], {"not a name": 1}):
        with pytest.raises(openai.BadRequestError) as err:
            _ask(client, extra_body={"chat_template_kwargs": bad})
        assert "chat_template_kwargs" in str(err.value)


REASONING = ("{% for m in messages %}{% if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{% endif %}"
             "{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}a{% endif %}")


def test_thinking_blocks_in_history_reach_a_template_with_a_place_for_them(tmp_path):
    """Anthropic requires thinking blocks to be passed back in tool loops; OpenAI-style
    clients send reasoning_content. A template that renders reasoning gets them."""
    import anthropic

    model = write_synthetic_gguf(tmp_path / "think.gguf", template=REASONING, script={"a": "x", "x": "x"})
    s = Server(model, tmp_path / "home")
    try:
        claude = anthropic.Anthropic(base_url=s.url, api_key="none", max_retries=0)
        plain = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": [{"type": "text", "text": "ok"}]},
                 {"role": "user", "content": "and?"}]
        thought = [plain[0], {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "the user greets me; I answer briefly", "signature": "sig"},
            {"type": "redacted_thinking", "data": "opaque"}, {"type": "text", "text": "ok"}]}, plain[2]]
        without = claude.messages.count_tokens(model="think.gguf", messages=plain).input_tokens
        with_thinking = claude.messages.count_tokens(model="think.gguf", messages=thought).input_tokens
        assert with_thinking > without + 5
        answered = claude.messages.create(model="think.gguf", max_tokens=2, messages=thought)
        assert answered.usage.input_tokens == with_thinking
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0)
        chat = [{"role": "user", "content": "hi"},
                {"role": "assistant", "content": "ok", "reasoning_content": "the user greets me; I answer briefly"},
                {"role": "user", "content": "and?"}]
        usage = client.chat.completions.create(model="think.gguf", messages=chat, max_tokens=2).usage
        assert usage.prompt_tokens == with_thinking
    finally:
        s.close()
