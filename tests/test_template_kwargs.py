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


def test_what_tallow_gives_the_template_cannot_be_overridden(client):
    for bad in ({"messages": []}, {"add_generation_prompt": False}, ["enable_thinking"], {"not a name": 1}):
        with pytest.raises(openai.BadRequestError) as err:
            _ask(client, extra_body={"chat_template_kwargs": bad})
        assert "chat_template_kwargs" in str(err.value)
