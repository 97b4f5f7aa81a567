"""A reasoning budget: a script model that thinks forever ("hmhm..." inside <think>) has its
thinking closed after N tokens on every route (the engine, run, chat, batch, serve's default,
and each API's own field), the answer ("OK") follows, and reasoning_tokens is N."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.processes import run_tallow
from helpers.server import Server
from helpers.synth import write_synthetic_gguf

from tallow.common.fields import EFFORT_BUDGETS

FOREVER = {"\n": "h", "h": "m", "m": "h", "</think>": "O", "O": "K", "K": "<|im_end|>"}
OPENS = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
         "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n<think>\\n' }}{% endif %}{# </think> #}")
# Qwen3's switch: enable_thinking false renders an empty thinking block
SWITCH = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n<think>' }}"
          "{% if enable_thinking is defined and not enable_thinking %}{{ '</think>' }}{% else %}{{ '\\n' }}{% endif %}"
          "{% endif %}")


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("think")
    return {"opens": write_synthetic_gguf(d / "opens.gguf", script=FOREVER, template=OPENS),
            "switch": write_synthetic_gguf(d / "switch.gguf", script=FOREVER, template=SWITCH)}


@pytest.fixture(scope="module")
def home(models, tmp_path_factory) -> Path:
    home = tmp_path_factory.mktemp("think-home")
    assert run_tallow(["import", str(models["opens"]), "--name", "thinker"], home=home).returncode == 0
    return home


def test_the_engine_closes_the_thinking_at_the_budget(models):
    from tallow.runtime.engine import Engine
    from tallow.runtime.types import LoadSettings, Sampling

    with Engine([models["opens"]], LoadSettings(n_ctx=512, n_threads=1)) as engine:
        def ask(budget):
            request = engine.request([{"role": "user", "content": "go"}], max_tokens=60, sampling=Sampling(temperature=0),
                                     reasoning_budget=budget)
            final = list(engine.stream(request))[-1]
            return final.text, final.reasoning, final.usage.reasoning_tokens

        assert ask(None) == ("", "hm" * 30, 60)  # without a budget it never stops thinking
        for n in (1, 2, 7, 30):
            assert ask(n) == ("OK", ("hm" * n)[:n - 1], n)  # the closing marker is the budget's last token
        assert ask(0) == ("OK", "", 1)  # no switch in this template: closed before the first thought
    with Engine([models["switch"]], LoadSettings(n_ctx=512, n_threads=1)) as engine:
        request = engine.request([{"role": "user", "content": "go"}], max_tokens=4, sampling=Sampling(temperature=0),
                                 reasoning_budget=0)
        final = list(engine.stream(request))[-1]
        assert final.usage.reasoning_tokens == 0 and final.reasoning == "" and not request.starts_in_reasoning


def test_run_chat_and_batch_take_a_budget(home, tmp_path):
    r = run_tallow(["run", "thinker", "go", "--reasoning-budget", "9", "--json", "-n", "60", "--no-cache"], home=home)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert (out["text"], out["usage"]["reasoning_tokens"]) == ("OK", 9)
    chat = run_tallow(["chat", "thinker", "--reasoning-budget", "5", "-n", "60", "--no-cache"], home=home, input=b"go\n")
    assert chat.returncode == 0 and "OK" in chat.stdout.decode(), chat.stderr
    lines = tmp_path / "in.jsonl"
    lines.write_text(json.dumps({"id": "a", "messages": [{"role": "user", "content": "go"}], "max_tokens": 60,
                                 "reasoning_budget": 4}) + "\n")
    r = run_tallow(["batch", str(lines), "-o", str(tmp_path / "out.jsonl"), "--model", "thinker"], home=home)
    assert r.returncode == 0, r.stderr
    record = json.loads((tmp_path / "out.jsonl").read_text())
    assert record["usage"]["reasoning_tokens"] == 4 and "OK" in json.dumps(record)


def test_think_as_ollama_says_it_on_the_command_line_and_in_chat(home):
    # --think and /set think take Ollama's words: off is a budget of 0, an effort its budget
    def reasoning(*flags: str) -> tuple[str, int]:
        r = run_tallow(["run", "thinker", "go", *flags, "--json", "-n", "600", "--no-cache"], home=home)
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        return out["text"], out["usage"]["reasoning_tokens"]

    assert reasoning("--think", "off") == ("OK", 1)  # closed before the first thought
    assert reasoning("--think", "low") == ("OK", EFFORT_BUDGETS["low"])
    for bad in (["--think", "maybe"], ["--think", "off", "--reasoning-budget", "3"]):
        r = run_tallow(["run", "thinker", "go", *bad], home=home)
        assert r.returncode == 2 and "--think" in r.stderr.decode()
    for command in (["run", "m", "hi"], ["chat", "m"]):  # a server decides its own: refused by the flag's name
        r = run_tallow([*command, "--endpoint", "http://127.0.0.1:9/v1", "--think", "low"], home=home)
        assert r.returncode == 2 and "--think sets the local engine" in r.stderr.decode()
    chat = run_tallow(["chat", "thinker", "-n", "60", "--no-cache", "--stats"], home=home,
                      input=b"/set think maybe\n/set think off\ngo\n")
    assert chat.returncode == 0, chat.stderr
    err = chat.stderr.decode()
    assert "think is 'on', 'off' or an effort: low, medium, high, not 'maybe'" in err and "think = off" in err
    assert "OK" in chat.stdout.decode()


def test_every_api_names_its_budget(home):
    import anthropic
    import ollama

    server = Server("thinker", home, "--offline", "--reasoning-budget", "6", "--max-tokens", "2048", "--parallel", "1",
                    "--ctx", "2048")  # past the synthetic model's 1,024: Anthropic's budgets start at 1,024
    try:
        client = server.client()
        go = [{"role": "user", "content": "go"}]
        plain = client.chat.completions.create(model="thinker", messages=go, max_tokens=300)
        assert (plain.choices[0].message.content, plain.usage.completion_tokens_details.reasoning_tokens) == ("OK", 6)
        own = client.chat.completions.create(model="thinker", messages=go, max_tokens=300, extra_body={"reasoning_budget": 3})
        assert own.usage.completion_tokens_details.reasoning_tokens == 3
        effort = client.chat.completions.create(model="thinker", messages=go, max_tokens=300, reasoning_effort="minimal")
        assert (effort.choices[0].message.content,
                effort.usage.completion_tokens_details.reasoning_tokens) == ("OK", EFFORT_BUDGETS["minimal"])
        resp = client.responses.create(model="thinker", input="go", max_output_tokens=300, reasoning={"effort": "minimal"})
        assert resp.output_text == "OK" and resp.usage.output_tokens_details.reasoning_tokens == EFFORT_BUDGETS["minimal"]

        claude = anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0)
        msg = claude.messages.create(model="thinker", max_tokens=1100, messages=go,
                                     thinking={"type": "enabled", "budget_tokens": 1024})
        kinds = [b.type for b in msg.content]
        assert kinds == ["thinking", "text"] and msg.content[1].text == "OK" and len(msg.content[0].thinking) == 1023

        ol = ollama.Client(host=server.url)
        low = ol.chat("thinker", messages=go, think="low", options={"num_predict": 700})
        assert low.message.content == "OK" and len(low.message.thinking) == EFFORT_BUDGETS["low"] - 1
        off = ol.chat("thinker", messages=go, think=False, options={"num_predict": 60})
        assert off.message.content == "OK" and not off.message.thinking
        for body, words in (({"reasoning_effort": "extreme"}, "'reasoning_effort' must be one of none, minimal"),
                            ({"reasoning_effort": "low", "reasoning_budget": 5}, "not both"),
                            ({"reasoning_budget": -2}, "'reasoning_budget' must be between -1")):
            status, _, err = server.raw("/v1/chat/completions", json.dumps({"messages": go, **body}).encode(),
                                        {"Content-Type": "application/json"})
            assert status == 400 and words in err["error"]["message"], err
    finally:
        server.close()
