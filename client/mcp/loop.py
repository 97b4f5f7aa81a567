"""The tool loop: the model is offered the MCP servers' tools; each call it makes is shown,
approved (or not) by the caller, run, and its result given back, until the model answers in
text or the step limit is reached (then it is asked once more with no tools, to answer from
what it has). Each round streams: its text and reasoning reach `said` as they come, the
call markup held back by the same `Answer` the API's streams use."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable

from tallow.client.mcp.config import MAX_STEPS
from tallow.client.mcp.hub import McpHub
from tallow.common.errors import TallowError
from tallow.runtime.answer import Answer
from tallow.runtime.answer import Outcome as Said
from tallow.runtime.tools.choice import Tool, ToolChoice
from tallow.runtime.tools.stream import Delta
from tallow.runtime.types import FinalEvent, ProgressEvent


@dataclass
class Step:
    """One call the model made: its tool, arguments, and what came back (or why not)."""

    tool: str
    arguments: dict[str, Any]
    result: str = ""
    error: bool = False
    allowed: bool = True
    id: str = ""  # the call's id in the conversation
    round: int = 0  # which of the model's answers made it (0: the first)

    def to_dict(self) -> dict[str, Any]:
        return {"tool": self.tool, "arguments": self.arguments, "allowed": self.allowed, "error": self.error,
                "result": self.result}

    def logged(self) -> dict[str, Any]:
        """As the history log keeps a call that was run (or denied): the chat page's shape, an
        OpenAI tool call with its round, whether it was allowed, and its result."""
        return {"id": self.id, "type": "function",
                "function": {"name": self.tool, "arguments": json.dumps(self.arguments, ensure_ascii=False)},
                "round": self.round, "allowed": self.allowed, "error": self.error, "result": self.result}


@dataclass
class Outcome:
    final: FinalEvent
    text: str
    steps: list[Step] = field(default_factory=list)
    cut: bool = False  # the step limit was reached


def offered(hub: McpHub, fmt: str) -> ToolChoice:
    """The servers' tools as a request's tool choice (auto: the model decides)."""
    tools = tuple(Tool(t.qualified, t.description, t.schema) for t in hub.tools)
    return ToolChoice(tools, "auto" if tools else "none", None, True, fmt)


def run_tools(engine, messages: list[dict[str, Any]], hub: McpHub, approve: Callable[[str, dict], bool],
              shown: Callable[[Step], None], max_steps: int = MAX_STEPS,
              said: Callable[[Delta], None] | None = None, **request: Any) -> Outcome:
    """Ask, run the calls the answer makes, and ask again, until the answer is text; `said`
    gets each round's content and reasoning deltas as they stream."""
    choice, steps = offered(hub, engine.tool_format()), list[Step]()
    messages = list(messages)
    room = (engine.n_ctx or 4096) // 4  # tokens: a result takes at most a quarter of the context
    for round_ in range(max_steps + 1):
        last = round_ == max_steps
        now = ToolChoice(choice.tools, "none", None, True, choice.format) if last else choice
        final, answer = _round(engine, engine.request(messages, tools=now, **request), Answer(now), said)
        if not answer.calls:
            return Outcome(final, answer.content, steps, cut=last and round_ > 0)
        calls = [{"id": cid, "name": name, "arguments": args} for cid, name, args in answer.calls]
        messages.append({"role": "assistant", "content": answer.content, "tool_calls": calls})
        for cid, name, args in answer.calls:
            step = _step(hub, name, json.loads(args), approve, lambda text: _fitted(engine, text, room))
            step.id, step.round = cid, round_
            steps.append(step)
            shown(step)
            messages.append({"role": "tool", "tool_call_id": cid, "name": name, "content": step.result})
    raise AssertionError("the last round offers no tools")  # pragma: no cover - it returns above


def _round(engine, request, answer: Answer, said: Callable[[Delta], None] | None) -> tuple[FinalEvent, Said]:
    """One answer streamed: its deltas to `said`, its final record and what it said."""
    for event in engine.stream(request):
        if isinstance(event, ProgressEvent):
            continue
        deltas, outcome = answer.finish(event) if isinstance(event, FinalEvent) else (answer.feed(event), None)
        for delta in deltas:
            if said is not None:
                said(delta)
        if outcome is not None:
            assert isinstance(event, FinalEvent)  # only the last event has an outcome
            return event, outcome
    raise TallowError("the engine ended without a final record")


def _step(hub: McpHub, name: str, arguments: dict[str, Any], approve: Callable[[str, dict], bool],
          fit: Callable[[str], str]) -> Step:
    if not approve(name, arguments):
        return Step(name, arguments, "the user did not allow this call", True, allowed=False)
    text, error = hub.call(name, arguments)
    return Step(name, arguments, fit(text), error)


def _fitted(engine, text: str, room: int) -> str:
    """A result cut to at most `room` tokens of the model's, saying how much was cut."""
    count = len(engine.model.tokenize(text, add_special=False, parse_special=False))
    if count <= room:
        return text
    keep = len(text)
    while count > room and keep > 0:  # shrink in proportion until it fits (twice, as a rule)
        keep = keep * room // count * 9 // 10
        count = len(engine.model.tokenize(text[:keep], add_special=False, parse_special=False))
    return text[:keep] + f"\n[... {len(text) - keep:,} more characters cut, to fit the context]"
