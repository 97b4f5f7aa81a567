"""Agents on tallow serve: tool calls through the official openai client (chat completions
and Responses), the anthropic client (Messages), and the OpenAI Agents SDK running an agent
with one function tool to completion."""

from __future__ import annotations

import json

import pytest
from helpers.server import Server
from helpers.synth import HERMES, write_synthetic_gguf

pytestmark = pytest.mark.slow  # three servers and the Agents SDK

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

CALL = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
CHAT_TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                                "parameters": PARAMS}},
              {"type": "function", "function": {"name": "get_time", "description": "The time in a city",
                                                "parameters": {"type": "object", "properties": {"zone": {"enum": ["utc", "cet"]}},
                                                               "required": ["zone"]}}}]
RESPONSE_TOOLS = [{"type": "function", "name": t["function"]["name"], "description": t["function"]["description"],
                   "parameters": t["function"]["parameters"]} for t in CHAT_TOOLS]
ANTHROPIC_TOOLS = [{"name": t["name"], "description": t["description"], "input_schema": t["parameters"]}
                   for t in RESPONSE_TOOLS]
# After a tool result the generation prompt ends in '~', which the script answers with "OK":
# a loop of call -> result -> answer on a model that does exactly what it is told.
LOOP = HERMES.replace("{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
                      "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
                      "{% if messages[-1]['role'] == 'tool' %}{{ '~' }}{% endif %}{% endif %}")
USER = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def loop_model(tmp_path_factory):
    assert LOOP != HERMES
    return write_synthetic_gguf(tmp_path_factory.mktemp("loop") / "agent.gguf", template=LOOP,
                                script={"\n": "<tool_call>", "<tool_call>": CALL, CALL: "</tool_call>",
                                        "</tool_call>": "<|im_end|>", "~": "O", "O": "K", "K": "<|im_end|>"},
                                extra_tokens=("<tool_call>", "</tool_call>", CALL))


@pytest.fixture(scope="module")
def server(loop_model, tmp_path_factory):
    s = Server(loop_model, tmp_path_factory.mktemp("home"), "--parallel", "2", "--seed", "7")
    yield s
    s.close()


def test_chat_tool_choice_auto_required_named_none(server):
    c = server.client()
    for choice in ("auto", "required", {"type": "function", "function": {"name": "get_weather"}}):
        r = c.chat.completions.create(model="agent.gguf", messages=USER, tools=CHAT_TOOLS, tool_choice=choice,
                                      temperature=0)
        msg = r.choices[0].message
        assert r.choices[0].finish_reason == "tool_calls" and msg.content is None
        assert [(t.function.name, json.loads(t.function.arguments)) for t in msg.tool_calls] == [("get_weather", {"city": "Paris"})]
        assert msg.tool_calls[0].id.startswith("call_")
    # a named choice forces that tool, whatever the model would have called
    r = c.chat.completions.create(model="agent.gguf", messages=USER, tools=CHAT_TOOLS, temperature=0,
                                  tool_choice={"type": "function", "function": {"name": "get_time"}})
    call = r.choices[0].message.tool_calls[0]
    assert call.function.name == "get_time" and json.loads(call.function.arguments)["zone"] in ("utc", "cet")
    # none: no calls are read out of the answer
    r = c.chat.completions.create(model="agent.gguf", messages=USER, tools=CHAT_TOOLS, tool_choice="none", temperature=0)
    assert r.choices[0].message.tool_calls is None and r.choices[0].finish_reason == "stop"


def test_streamed_tool_calls_assembled_by_the_client(server):
    c = server.client()
    with c.chat.completions.stream(model="agent.gguf", messages=USER, tools=CHAT_TOOLS, temperature=0) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_completion()
    assert "tool_calls.function.arguments.delta" in kinds
    call = final.choices[0].message.tool_calls[0]
    assert final.choices[0].finish_reason == "tool_calls"
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Paris"})
    # raw chunks: one index per call, the id and name first, then argument fragments
    chunks = list(c.chat.completions.create(model="agent.gguf", messages=USER, tools=CHAT_TOOLS, temperature=0,
                                            stream=True))
    deltas = [d for ch in chunks for d in (ch.choices[0].delta.tool_calls or [])]
    assert deltas[0].index == 0 and deltas[0].id and deltas[0].function.name == "get_weather"
    assert all(d.index == 0 for d in deltas) and "".join(d.function.arguments or "" for d in deltas) == '{"city": "Paris"}'
    assert chunks[-1].system_fingerprint.startswith("tallow-")


def test_a_two_step_tool_loop(server):
    c = server.client()
    first = c.chat.completions.create(model="agent.gguf", messages=USER, tools=CHAT_TOOLS, temperature=0)
    call = first.choices[0].message.tool_calls[0]
    history = USER + [first.choices[0].message.model_dump(exclude_none=True),
                      {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"}]
    second = c.chat.completions.create(model="agent.gguf", messages=history, tools=CHAT_TOOLS, temperature=0)
    assert second.choices[0].message.content == "OK" and second.choices[0].finish_reason == "stop"
    # the second turn re-reads neither the tools nor the question
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 1


def test_responses_with_and_without_previous_response_id(server):
    c = server.client()
    first = c.responses.create(model="agent.gguf", input="What is the weather in Paris?", tools=RESPONSE_TOOLS,
                               instructions="Be brief.", temperature=0)
    assert first.status == "completed" and [i.type for i in first.output] == ["function_call"]
    call = first.output[0]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    second = c.responses.create(model="agent.gguf", previous_response_id=first.id, tools=RESPONSE_TOOLS,
                                instructions="Be brief.", temperature=0,
                                input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}])
    assert second.output_text == "OK"
    # turn 2 does not re-read turn 1: only what follows the stored conversation is evaluated
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens - 1
    new = second.usage.input_tokens - first.usage.input_tokens  # the call and its result, as rendered
    assert second.usage.input_tokens - second.usage.input_tokens_details.cached_tokens <= new
    assert c.responses.retrieve(second.id).output_text == "OK"
    c.responses.delete(second.id)
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(second.id)
    with pytest.raises(openai.NotFoundError):
        c.responses.create(model="agent.gguf", previous_response_id="resp_nope", input="hi")
    unstored = c.responses.create(model="agent.gguf", input="hi", store=False, max_output_tokens=4)
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(unstored.id)


def test_responses_streaming_events_in_order(server):
    c = server.client()
    with c.responses.stream(model="agent.gguf", input="What is the weather in Paris?", tools=RESPONSE_TOOLS,
                            temperature=0) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert kinds.index("response.output_item.added") < kinds.index("response.function_call_arguments.delta") \
        < kinds.index("response.function_call_arguments.done") < kinds.index("response.output_item.done")
    assert [e.sequence_number for e in events] == list(range(1, len(events) + 1))
    assert final.output[0].type == "function_call" and json.loads(final.output[0].arguments) == {"city": "Paris"}
    # text answers stream as output_text deltas in a message item
    events = list(c.responses.create(model="agent.gguf", input="hi", max_output_tokens=2, stream=True))
    kinds = [e.type for e in events]
    assert "response.output_text.delta" in kinds and "response.content_part.added" in kinds
    # cut by max_output_tokens: the stream ends as OpenAI's does, with response.incomplete
    assert kinds[-1] == "response.incomplete"
    text = events[-1].response
    assert text.status == "incomplete" and text.incomplete_details.reason == "max_output_tokens"
    assert text.usage.output_tokens == 2 and text.output[0].content[0].text


def test_anthropic_messages_tool_loop_streaming_and_count_tokens(server):
    a = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)
    # (this client no longer takes temperature as an argument; the API still does)
    first = a.messages.create(model="agent.gguf", max_tokens=64, messages=USER, tools=ANTHROPIC_TOOLS,
                              system="Be brief.", extra_body={"temperature": 0})
    assert first.stop_reason == "tool_use" and first.content[0].type == "tool_use"
    use = first.content[0]
    assert use.name == "get_weather" and use.input == {"city": "Paris"}
    history = USER + [{"role": "assistant", "content": [b.model_dump() for b in first.content]},
                      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}]}]
    second = a.messages.create(model="agent.gguf", max_tokens=64, messages=history, tools=ANTHROPIC_TOOLS,
                               system="Be brief.", extra_body={"temperature": 0})
    assert second.stop_reason == "end_turn" and second.content[0].text == "OK"
    assert second.usage.cache_read_input_tokens > 0
    with a.messages.stream(model="agent.gguf", max_tokens=64, messages=USER, tools=ANTHROPIC_TOOLS,
                           extra_body={"temperature": 0}) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and "content_block_start" in kinds
    assert final.content[0].input == {"city": "Paris"} and final.stop_reason == "tool_use"
    counted = a.messages.count_tokens(model="agent.gguf", messages=USER, tools=ANTHROPIC_TOOLS, system="Be brief.")
    assert counted.input_tokens == first.usage.input_tokens + first.usage.cache_read_input_tokens
    stopped = a.messages.create(model="agent.gguf", max_tokens=64, messages=history, stop_sequences=["K"],
                                extra_body={"temperature": 0})
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == "K" and stopped.content[0].text == "O"
    with pytest.raises(anthropic.BadRequestError) as bad:
        a.messages.create(model="agent.gguf", max_tokens=8, messages=[{"role": "system", "content": "x"}])
    assert bad.value.body["type"] == "error" and bad.value.body["error"]["type"] == "invalid_request_error"


def test_anthropic_x_api_key(loop_model, tmp_path):
    s = Server(loop_model, tmp_path, "--api-key", "k3y")
    try:
        with pytest.raises(anthropic.AuthenticationError) as refused:
            anthropic.Anthropic(base_url=s.url, api_key="wrong", max_retries=0).messages.create(
                model="agent.gguf", max_tokens=4, messages=USER)
        assert refused.value.body["error"]["type"] == "authentication_error"
        ok = anthropic.Anthropic(base_url=s.url, api_key="k3y", max_retries=0).messages.create(
            model="agent.gguf", max_tokens=4, messages=USER)
        assert ok.usage.output_tokens >= 1
    finally:
        s.close()


def test_the_openai_agents_sdk_runs_an_agent_with_a_tool(server):
    agents = pytest.importorskip("agents")
    from agents import Agent, OpenAIResponsesModel, RunConfig, Runner, function_tool

    calls = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        calls.append(city)
        return f"sunny in {city}"

    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    agent = Agent(name="weather", instructions="Answer with the weather.", tools=[get_weather],
                  model=OpenAIResponsesModel(model="agent.gguf", openai_client=client))
    result = Runner.run_sync(agent, "What is the weather in Paris?", run_config=RunConfig(tracing_disabled=True),
                             max_turns=4)
    assert calls == ["Paris"] and result.final_output == "OK"
    assert agents is not None


def test_reasoning_items_and_thinking_blocks(tmp_path):
    """A model that thinks in <think> blocks: a reasoning item first in a Response, a thinking
    block in a Message when thinking is asked for (and none when it is not)."""
    from test_chat import THINK_SCRIPT, THINK_TEMPLATE

    path = write_synthetic_gguf(tmp_path / "think.gguf", script=THINK_SCRIPT, template=THINK_TEMPLATE)
    s = Server(path, tmp_path / "home")
    try:
        r = s.client().responses.create(model="think.gguf", input="hi", temperature=0)
        assert [i.type for i in r.output] == ["reasoning", "message"]
        assert r.output[0].content[0].text == "hm" and r.output_text == "OK"
        assert r.usage.output_tokens_details.reasoning_tokens == 3
        with s.client().responses.stream(model="think.gguf", input="hi", temperature=0) as stream:
            kinds = [e.type for e in stream]
        assert kinds.index("response.reasoning_text.delta") < kinds.index("response.output_text.delta")
        a = anthropic.Anthropic(base_url=s.url, api_key="unused", max_retries=0)
        m = a.messages.create(model="think.gguf", max_tokens=2048, messages=[{"role": "user", "content": "hi"}],
                              thinking={"type": "enabled", "budget_tokens": 1024})
        assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in m.content] == \
            [("thinking", "hm"), ("text", "OK")]
        with a.messages.stream(model="think.gguf", max_tokens=2048, messages=[{"role": "user", "content": "hi"}],
                               thinking={"type": "enabled", "budget_tokens": 1024}) as stream:
            final = stream.get_final_message()
        assert final.content[0].type == "thinking" and final.content[0].thinking == "hm"
        plain = a.messages.create(model="think.gguf", max_tokens=64, messages=[{"role": "user", "content": "hi"}])
        assert [b.type for b in plain.content] == ["text"]
        with pytest.raises(anthropic.BadRequestError):  # the budget must be below max_tokens
            a.messages.create(model="think.gguf", max_tokens=64, messages=[{"role": "user", "content": "hi"}],
                              thinking={"type": "enabled", "budget_tokens": 1024})
    finally:
        s.close()


def test_run_tools_prints_calls_and_batch_records_carry_them(loop_model, tmp_path):
    from helpers.processes import run_tallow

    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps([t["function"] for t in CHAT_TOOLS]))
    r = run_tallow(["run", str(loop_model), "What is the weather in Paris?", "--tools", str(tools), "--temperature", "0"],
                   home=tmp_path)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["finish_reason"] == "tool_calls" and out["content"] is None
    assert [(c["name"], c["arguments"]) for c in out["tool_calls"]] == [("get_weather", {"city": "Paris"})]
    r = run_tallow(["run", str(loop_model), "hi", "--tools", str(tools), "--tool-choice", "nope"], home=tmp_path)
    assert r.returncode == 2 and b"--tool-choice" in r.stderr and b"Traceback" not in r.stderr
    tools.write_text("[{]")
    r = run_tallow(["run", str(loop_model), "hi", "--tools", str(tools)], home=tmp_path)
    assert r.returncode == 1 and b"tools" in r.stderr and b"Traceback" not in r.stderr
    lines = tmp_path / "in.jsonl"
    lines.write_text(json.dumps({"id": 1, "messages": USER, "tools": CHAT_TOOLS, "temperature": 0}) + "\n"
                     + json.dumps({"id": 2, "messages": USER, "tools": CHAT_TOOLS, "tool_choice": "required",
                                   "frobnicate": 1}) + "\n")
    r = run_tallow(["batch", str(lines), "-m", str(loop_model), "-o", str(tmp_path / "out.jsonl")], home=tmp_path)
    records = {rec["id"]: rec for rec in map(json.loads, (tmp_path / "out.jsonl").read_text().splitlines())}
    assert records[1]["finish_reason"] == "tool_calls"
    assert records[1]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert "frobnicate" in records[2]["error"]  # the same validation as the server's
    assert r.returncode == 1


def test_legacy_functions_are_answered_in_their_own_shape(server):
    """Older SDKs send `functions` and expect `function_call` back, and send the result as a
    message of role `function`."""
    c = server.client()
    functions = [t["function"] for t in CHAT_TOOLS]
    r = c.chat.completions.create(model="agent.gguf", messages=USER, functions=functions, temperature=0)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "function_call" and msg.tool_calls is None
    assert (msg.function_call.name, json.loads(msg.function_call.arguments)) == ("get_weather", {"city": "Paris"})
    named = c.chat.completions.create(model="agent.gguf", messages=USER, functions=functions, temperature=0,
                                      function_call={"name": "get_time"})
    assert named.choices[0].message.function_call.name == "get_time"
    pieces, finish = {}, None
    for chunk in c.chat.completions.create(model="agent.gguf", messages=USER, functions=functions, temperature=0,
                                           stream=True):
        for ch in chunk.choices:
            if ch.delta.function_call is not None:
                for key in ("name", "arguments"):
                    pieces[key] = pieces.get(key, "") + (getattr(ch.delta.function_call, key) or "")
            finish = ch.finish_reason or finish
    assert finish == "function_call" and pieces["name"] == "get_weather"
    assert json.loads(pieces["arguments"]) == {"city": "Paris"}
    # the result as a `function` message: the loop's model answers "OK" after a tool result
    history = [*USER, {"role": "assistant", "content": None, "function_call": {"name": "get_weather",
                                                                               "arguments": '{"city": "Paris"}'}},
               {"role": "function", "name": "get_weather", "content": "Sunny, 21 C"}]
    done = c.chat.completions.create(model="agent.gguf", messages=history, functions=functions, temperature=0)
    assert done.choices[0].message.content == "OK" and done.choices[0].finish_reason == "stop"
    with pytest.raises(openai.BadRequestError, match="functions"):
        c.chat.completions.create(model="agent.gguf", messages=USER, functions=functions, tools=CHAT_TOOLS)


def test_the_counting_routes_equal_the_prompt_tokens_of_the_same_request(server):
    # llama-server's /v1/chat/completions/input_tokens and OpenAI's /v1/responses/input_tokens:
    # the prompt the same body would evaluate (template and tools included), not a guess
    import urllib.request

    c = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    chat = {"model": "agent.gguf", "messages": USER, "tools": CHAT_TOOLS, "max_tokens": 1}
    asked = c.chat.completions.create(**chat)
    request = urllib.request.Request(server.url + "/v1/chat/completions/input_tokens", json.dumps(chat).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as r:
        assert json.loads(r.read()) == {"input_tokens": asked.usage.prompt_tokens}
    answered = c.responses.create(model="agent.gguf", input="What is the weather in Paris?", tools=RESPONSE_TOOLS,
                                  instructions="Be brief.", max_output_tokens=1)
    counted = c.responses.input_tokens.count(model="agent.gguf", input="What is the weather in Paris?",
                                             tools=RESPONSE_TOOLS, instructions="Be brief.")
    assert counted.object == "response.input_tokens" and counted.input_tokens == answered.usage.input_tokens
    with pytest.raises(openai.BadRequestError, match="surprise"):
        c.responses.input_tokens.count(model="agent.gguf", input="hi", extra_body={"surprise": 1})


HEAD, TAIL = '{"name": "get_weather", "arguments": ', '{"city": "Paris"}}'


def test_calls_completed_before_max_tokens_cut_are_kept(tmp_path):
    # a model that calls again and again: max_tokens ends it inside its second call, and the
    # first comes back as a call (finish reason length), not the envelope as text
    model = write_synthetic_gguf(tmp_path / "again.gguf", template=HERMES, extra_tokens=("<tool_call>", "</tool_call>", HEAD, TAIL),
                                 script={"\n": "<tool_call>", "<tool_call>": HEAD, HEAD: TAIL, TAIL: "</tool_call>",
                                         "</tool_call>": "<tool_call>"})
    s = Server(model, tmp_path / "home")
    try:
        c = s.client()
        body = {"model": "again.gguf", "messages": USER, "tools": CHAT_TOOLS, "tool_choice": "required",
                "temperature": 0, "max_tokens": 6}
        r = c.chat.completions.create(**body)
        msg = r.choices[0]
        assert msg.finish_reason == "length" and not msg.message.content
        assert [(t.function.name, json.loads(t.function.arguments)) for t in msg.message.tool_calls] == \
            [("get_weather", {"city": "Paris"})]
        chunks = list(c.chat.completions.create(**body, stream=True))
        assert chunks[-1].choices[0].finish_reason == "length"
        assert not "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)  # no envelope as text
        a = anthropic.Anthropic(base_url=s.url, api_key="unused", max_retries=0)
        m = a.messages.create(model="again.gguf", max_tokens=6, messages=USER, tools=ANTHROPIC_TOOLS,
                              tool_choice={"type": "any"}, extra_body={"temperature": 0})
        assert m.stop_reason == "max_tokens"
        assert [(b.name, b.input) for b in m.content if b.type == "tool_use"] == [("get_weather", {"city": "Paris"})]
        assert not any(b.type == "text" and b.text for b in m.content)
    finally:
        s.close()
