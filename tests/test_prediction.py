"""OpenAI's Predicted Outputs on tallow serve: the predicted text is the lookup drafter's
first source, so an answer close to it is verified in batches; the answer itself is the one
plain decoding gives, and usage says how many predicted tokens were taken. And `echo` on
text completions, the other field of OpenAI's that changes what comes back around an answer."""

from __future__ import annotations

import openai
import pytest

pytestmark = pytest.mark.default_model  # a real model's answers tokenize back to the tokens it chose


@pytest.fixture(scope="module")
def client(default_model, tmp_path_factory):
    from helpers.server import Server

    s = Server(default_model, tmp_path_factory.mktemp("prediction"), "--parallel", "2")
    yield openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0)
    s.close()


ASK = {"model": "tallow", "messages": [{"role": "user", "content": "Write a short list of three fruits and why each "
                                                                 "is good."}], "max_tokens": 48, "temperature": 0}


def test_a_prediction_of_the_answer_is_taken_and_the_answer_does_not_change(client):
    plain = client.chat.completions.create(**ASK)
    text = plain.choices[0].message.content
    assert plain.usage.completion_tokens == 48 and (plain.usage.completion_tokens_details is None or
                                                    not plain.usage.completion_tokens_details.accepted_prediction_tokens)
    predicted = client.chat.completions.create(**ASK, prediction={"type": "content", "content": text})
    assert predicted.choices[0].message.content == text
    details = predicted.usage.completion_tokens_details
    assert details.accepted_prediction_tokens >= 24, details  # most of the answer came as verified drafts
    pieces = []
    for chunk in client.chat.completions.create(**ASK, stream=True, prediction={"type": "content", "content": [
            {"type": "text", "text": text}]}):
        pieces += [c.delta.content or "" for c in chunk.choices]
    assert "".join(pieces) == text


def test_a_wrong_prediction_costs_only_rejections(client):
    text = client.chat.completions.create(**ASK).choices[0].message.content
    wrong = client.chat.completions.create(**ASK, prediction={"type": "content", "content": "zebra " * 40})
    assert wrong.choices[0].message.content == text
    assert wrong.usage.completion_tokens_details.accepted_prediction_tokens == 0


def test_a_bad_prediction_is_refused_by_name(client):
    for bad in ({"type": "image", "content": "x"}, {"type": "content", "content": 5}, "text"):
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(**ASK, prediction=bad)
        assert "prediction" in str(err.value)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(**ASK, prediction={"type": "content", "content": "x"},
                                       extra_body={"draft": "some-draft-model"})


def test_echo_writes_the_prompt_before_the_completion(client):
    ask = {"model": "tallow", "prompt": "The three primary colours are", "max_tokens": 8, "temperature": 0}
    plain = client.completions.create(**ask).choices[0].text
    echoed = client.completions.create(**ask, echo=True).choices[0].text
    assert echoed == ask["prompt"] + plain
    streamed = "".join(c.choices[0].text for c in client.completions.create(**ask, echo=True, stream=True) if c.choices)
    assert streamed == echoed
    with pytest.raises(openai.BadRequestError, match="echo"):
        client.completions.create(**ask, echo=True, logprobs=2)
