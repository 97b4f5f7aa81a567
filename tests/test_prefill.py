"""Assistant prefill: a conversation that ends with the assistant's text continues it, on
OpenAI's chat completions, Anthropic's Messages and Ollama's chat, streamed and whole, with
the official clients and the default model; vLLM's flags say it outright; a template that
cannot show the text as given refuses by name rather than start a new turn."""

from __future__ import annotations

import json
import urllib.request

import pytest
from helpers.server import Server
from helpers.synth import write_synthetic_gguf

pytestmark = pytest.mark.default_model

COUNT = [{"role": "user", "content": "Count from 1 to 10, separated by commas."},
         {"role": "assistant", "content": "1, 2, 3, 4, 5, 6,"}]
NEXT = " 7, 8"  # what the default model says next at temperature 0 (a new turn starts again at 1)


@pytest.fixture(scope="module")
def server(default_model, tmp_path_factory):
    s = Server(default_model, tmp_path_factory.mktemp("prefill"), "--parallel", "2")
    yield s
    s.close()


def test_openai_chat_continues_the_assistant_message(server):
    client = server.client()
    whole = client.chat.completions.create(model="tallow", messages=COUNT, max_tokens=8, temperature=0)
    assert whole.choices[0].message.content.startswith(NEXT), whole.choices[0].message.content
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="tallow", messages=COUNT, max_tokens=8, temperature=0, stream=True) if c.choices)
    assert streamed == whole.choices[0].message.content
    # vLLM's flags: continue_final_message says it outright; false, or a generation prompt, is a new turn
    said = client.chat.completions.create(model="tallow", messages=COUNT, max_tokens=8, temperature=0,
                                          extra_body={"continue_final_message": True, "add_generation_prompt": False})
    assert said.choices[0].message.content == whole.choices[0].message.content
    fresh = client.chat.completions.create(model="tallow", messages=COUNT, max_tokens=8, temperature=0,
                                           extra_body={"continue_final_message": False})
    assert not fresh.choices[0].message.content.startswith(NEXT)


def test_anthropic_messages_continue_the_prefill(server):
    import anthropic

    client = anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0)
    whole = client.messages.create(model="tallow", max_tokens=8, messages=COUNT, extra_body={"temperature": 0})
    assert whole.content[0].text.startswith(NEXT), whole.content[0].text
    with client.messages.stream(model="tallow", max_tokens=8, messages=COUNT, extra_body={"temperature": 0}) as s:
        assert "".join(s.text_stream) == whole.content[0].text


def test_ollama_chat_continues_the_last_assistant_message(server):
    import ollama

    client = ollama.Client(host=server.url)
    whole = client.chat(model="tallow", messages=COUNT, options={"temperature": 0, "num_predict": 8})
    assert whole.message.content.startswith(NEXT), whole.message.content
    streamed = "".join(part.message.content for part in client.chat(
        model="tallow", messages=COUNT, stream=True, options={"temperature": 0, "num_predict": 8}))
    assert streamed == whole.message.content


def test_bad_combinations_are_refused_by_name(server):
    import openai

    client = server.client()
    user_last = COUNT[:1]
    for extra, param in (({"continue_final_message": True}, "continue_final_message"),
                         ({"continue_final_message": "yes"}, "continue_final_message")):
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model="tallow", messages=user_last, max_tokens=4, extra_body=extra)
        assert param in str(err.value)
    with pytest.raises(openai.BadRequestError, match="cannot both be true"):
        client.chat.completions.create(model="tallow", messages=COUNT, max_tokens=4, extra_body={
            "continue_final_message": True, "add_generation_prompt": True})


def test_a_template_that_rewrites_the_text_cannot_continue_it(tmp_path):
    rewriting = "{% for m in messages %}<{{ m.role }}>{{ m.content | upper }}</s>{% endfor %}" \
                "{% if add_generation_prompt %}<assistant>{% endif %}"
    model = write_synthetic_gguf(tmp_path / "upper.gguf", template=rewriting)
    s = Server(model, tmp_path / "home")
    try:
        body = json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "well,"}],
                           "max_tokens": 4}).encode()
        req = urllib.request.Request(s.url + "/v1/chat/completions", data=body, headers={"content-type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req, timeout=60)
        assert err.value.code == 400
        assert "cannot continue an assistant message" in json.loads(err.value.read())["error"]["message"]
    finally:
        s.close()
