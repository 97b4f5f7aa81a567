"""Very long inputs are refused for what they are before the work they would cause is done:
a conversation or a prompt that cannot fit the context gets its 400 without being tokenized
(the bound: no token is longer than the vocabulary's longest), while other requests go on."""

from __future__ import annotations

import json
import threading

import pytest
from helpers.server import Server

pytestmark = pytest.mark.slow  # a server, and bodies of megabytes


def test_a_hundred_thousand_messages_are_refused_before_tokenizing_while_others_are_served(synth_model, tmp_path):
    s = Server(synth_model, tmp_path, "--parallel", "2", "--max-body", str(16 * 1024 * 1024))
    try:
        answered: dict[str, object] = {}

        def ordinary() -> None:
            answered["other"] = s.client().chat.completions.create(
                model="synthetic.gguf", messages=[{"role": "user", "content": "hello"}], max_tokens=4)

        many = [{"role": "user" if i % 2 == 0 else "assistant", "content": "hi"} for i in range(100_000)]
        other = threading.Thread(target=ordinary)
        other.start()
        status, _, body = s.raw("/v1/chat/completions", json.dumps({"model": "synthetic.gguf", "messages": many}).encode(),
                                {"Content-Type": "application/json"})
        other.join(120)
        assert status == 400 and body["error"]["code"] == "context_length_exceeded", body
        assert "at least" in body["error"]["message"]  # the bound's refusal: the text was never tokenized
        assert answered["other"].choices[0].finish_reason in ("stop", "length")
        prompt = "word " * 2_000_000  # ten million characters, on the completion route
        status, _, body = s.raw("/v1/completions", json.dumps({"model": "synthetic.gguf", "prompt": prompt}).encode(),
                                {"Content-Type": "application/json"})
        assert status == 400 and "at least" in body["error"]["message"], body
        # one word of half a million characters, and of CJK (llama.cpp #21919's class: a stack
        # overflow in tokenizing long text without a break): tokenized, counted, refused
        for word in ("a" * 500_000, "\u4e00" * 200_000):
            status, _, body = s.raw("/v1/completions", json.dumps({"model": "synthetic.gguf", "prompt": word}).encode(),
                                    {"Content-Type": "application/json"})
            assert status == 400 and body["error"]["code"] == "context_length_exceeded", body
        again = s.client().completions.create(model="synthetic.gguf", prompt="one more", max_tokens=2)
        assert again.choices[0].text is not None  # the server goes on
    finally:
        s.close()


def test_a_prompt_that_fits_is_counted_exactly_not_by_the_bound(synth_engine):
    from tallow.runtime.errors import ContextOverflow

    near = "a " * (synth_engine.n_ctx * 4)  # over the quick length check, under the bound: tokenized and counted
    synth_engine.within_reach(near)
    with pytest.raises(ContextOverflow, match="at least"):
        synth_engine.within_reach("a" * (synth_engine.n_ctx * 4 * synth_engine.model.longest_token()))
