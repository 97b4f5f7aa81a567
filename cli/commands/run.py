"""tallow run: one prompt in, a streamed answer out, and what it cost."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any, NamedTuple, Optional

import typer

from tallow.cli import options as o
from tallow.cli import presets
from tallow.cli.commands.history_cmds import log_turn, open_history
from tallow.cli.errors import EXIT_INTERRUPTED
from tallow.cli.field_flags import with_sampling_flags
from tallow.cli.flag_groups import (
    DraftFlags,
    EndpointFlags,
    FlagGroup,
    FormatFlags,
    LoadFlags,
    ModelFiles,
    ShowFlags,
    with_groups,
)
from tallow.cli.mcp_tools import McpFlags, answer_with_mcp
from tallow.cli.models import open_engine
from tallow.cli.render import err_console, stats_line, stderr_is_terminal
from tallow.common.errors import TallowError
from tallow.env import settings
from tallow.runtime.media import with_markers
from tallow.runtime.types import FinalEvent, LoadSettings, Request, Sampling, SchedulerSettings, TokenEvent


def read_prompt(prompt: str | None) -> tuple[str, str | None]:
    """(the prompt, the piped document when there is one and a PROMPT after it).
    Piped stdin goes before PROMPT; invalid UTF-8 is replaced, not fatal."""
    piped = ""
    if not sys.stdin.isatty():
        piped = sys.stdin.buffer.read().decode("utf-8", errors="replace").strip("\n")
    text = "\n\n".join(p for p in (piped, prompt) if p)
    if not text.strip():
        raise typer.BadParameter("the prompt is empty: stdin had no text and no PROMPT was given", param_hint="PROMPT")
    return text, (piped if piped and prompt else None)


class ToolFlags(FlagGroup):
    """--tools: offer a file's tools, and print the answer and its calls as JSON."""

    tools_file: Annotated[Optional[Path], typer.Option("--tools", help="Offer the tools in this JSON file (a list of OpenAI function tools); prints the answer and its calls as JSON.", show_default=False)] = None
    tool_choice: Annotated[str, typer.Option("--tool-choice", help="With --tools: auto, required, none, or a tool's name.")] = "auto"
    tool_format: o.ToolFormat = "auto"

    def spec(self):
        return _read_tools(self.tools_file, self.tool_choice, o.parse_tool_format(self.tool_format)) \
            if self.tools_file is not None else None


class HistoryFlags(FlagGroup):
    """The history log: continue a logged conversation, or leave this one out."""

    continue_: Annotated[bool, typer.Option("--continue", "-c", help="Continue the most recent logged conversation.")] = False
    cid: Annotated[Optional[str], typer.Option("--cid", help="Continue the logged conversation with this id.", show_default=False)] = None
    no_log: o.NoLog = False


@presets.with_preset
@with_sampling_flags
@with_groups(load=LoadFlags, files=ModelFiles, drafting=DraftFlags, show=ShowFlags, tools=ToolFlags, past=HistoryFlags,
             shape=FormatFlags, server=EndpointFlags, mcp=McpFlags)
def run(
    model: o.Model,
    prompt: str = typer.Argument(None, help="The prompt. Piped stdin is read and put before it. "
                                 "Without one, on a terminal: an interactive chat.", show_default=False),
    system: o.System = None,
    max_tokens: o.MaxTokens = None,
    stop: o.Stop = None,
    raw: o.Raw = False,
    image: o.Image = None,
    audio: o.Audio = None,
    video: o.Video = None,
    video_fps: o.VideoFps = 1.0,
    reasoning_budget: o.ReasoningBudget = None,
    think: o.Think = None,
    offline: o.Offline = False,
    as_json: o.Json = False,
    logprobs: Optional[int] = typer.Option(None, "--logprobs", min=0, max=20, help="With --json: each token's log-probability and its N most likely alternatives (as the API's logprobs).", show_default=False),
    no_cache: o.NoCache = False,
    n: int = typer.Option(1, "--n", min=1, max=16, help="Give N answers, each sampled with its own seed (--seed, then the next ones), from one evaluation of the prompt."),
    *, sampling_flags: dict, load: LoadFlags, files: ModelFiles, drafting: DraftFlags, show: ShowFlags, tools: ToolFlags,
    past: HistoryFlags, shape: FormatFlags, server: EndpointFlags, mcp: McpFlags,
) -> None:
    """Run a model on one prompt and stream the answer.

    With --endpoint, an OpenAI-compatible server answers (MODEL is its name for the model)
    and the stats are measured here.

    Example: tallow run smollm2:135m "Why is the sky blue?"
    """
    remote = server.servers(offline)
    _check(remote, {**load.given(), **files.given(), **drafting.given(), **mcp.given(), "--think": think is not None,
                    "--reasoning-budget": reasoning_budget is not None}, tools, n, (image, audio, video), no_cache,
           logprobs, as_json)
    _check_mcp(mcp, tools, n, prompt)
    reasoning_budget = o.thinking(think, reasoning_budget)
    spec, (grammar, schema) = tools.spec(), shape.structured()
    history = open_history(not past.no_log)
    conversation_id, earlier, system = _continued(history, past.continue_, past.cid, system)
    ask = Ask(model, system, max_tokens, tuple(stop or ()), raw, reasoning_budget, offline or settings.offline(),
              as_json, logprobs, no_cache, n, replace(presets.sampling_base(), **sampling_flags), spec, grammar, schema,
              shape.grammar is None and grammar is not None, mcp if mcp.mcp is not None else None)
    media = o.read_media(image, audio, video, video_fps)
    interactive = prompt is None and sys.stdin.isatty() and sys.stdout.isatty() and not as_json and ask.tools is None
    text, document = _prompt_text(prompt, interactive, media, (image, audio, video), n)
    local = None if remote else _local_load(load.settings(files), drafting, ask, text)
    name, engine = open_engine(model, remote, local, ask.offline, not no_cache, shape.format_, schema,
                               allow_logprobs=True, projector="needed" if media else "if-stored" if interactive else "no",
                               media={m.kind for m in media})
    with engine:
        if interactive:
            return _interactive(engine, ask, name, earlier, show, history, conversation_id)
        assert text is not None  # read above, since this run is not interactive
        final, calls = _answer(engine, ask, name, earlier, text, document, media, drafting, show, history, conversation_id)
    if final is None:  # several answers, shown and logged
        return
    log_turn(history, conversation_id, name, system, text, final, calls)
    if final.finish_reason == "interrupted":
        raise typer.Exit(EXIT_INTERRUPTED)
    if ask.json_answer:
        o.check_structured(final.text, final.finish_reason, schema)


class Ask(NamedTuple):
    """What a run asks of the model, once its flags are checked."""

    model: str
    system: str | None
    max_tokens: int | None
    stop: tuple[str, ...]
    raw: bool
    reasoning_budget: int | None
    offline: bool
    as_json: bool
    logprobs: int | None
    no_cache: bool
    n: int
    sampling: Sampling
    tools: Any
    grammar: str | None
    schema: Any
    json_answer: bool = False  # --format or --json-schema: the answer is checked to be JSON (its schema's)
    mcp: Any = None  # McpFlags: tools from MCP servers, run as the model calls them


def _check(remote, local: dict[str, bool], tools: ToolFlags, n: int, media: tuple, no_cache: bool, logprobs,
           as_json: bool) -> None:
    """The flags that cannot go together, refused by name before anything loads; `local`: the
    local engine's flags, and whether each was given."""
    if logprobs is not None and not as_json:
        raise typer.BadParameter("log-probabilities are printed in the JSON: add --json", param_hint="--logprobs")
    if remote:
        o.refuse_local({**local, "--no-cache": no_cache, "--tools": tools.tools_file is not None,
                        "--tool-format": tools.tool_format != "auto", "--image": bool(media[0]), "--audio": bool(media[1]),
                        "--video": bool(media[2]), "--n": n > 1})
    if n > 1 and tools.tools_file is not None:
        raise typer.BadParameter("several answers with tools are not offered here; give n in a batch line or a request",
                                 param_hint="--n")


def _check_mcp(mcp: McpFlags, tools: ToolFlags, n: int, prompt: str | None) -> None:
    mcp.check()
    if mcp.mcp is None:
        return
    clash = "--tools" if tools.tools_file is not None else "--n" if n > 1 else None
    if clash:
        raise typer.BadParameter(f"--mcp runs the tools it offers; it does not go with {clash}", param_hint="--mcp")
    if prompt is None:
        raise typer.BadParameter("--mcp needs a PROMPT here; for a chat with MCP tools: tallow chat MODEL --mcp CONFIG",
                                 param_hint="--mcp")


def _prompt_text(prompt: str | None, interactive: bool, media: list, given: tuple, n: int):
    """(the prompt, a piped document before it): none for an interactive chat. `given`: the
    --image, --audio and --video paths."""
    if media and prompt is None:
        noun = next(w for w, paths in zip(("an image", "audio", "a video"), given) if paths)
        raise typer.BadParameter(f"{noun} needs a PROMPT to go with it", param_hint="PROMPT")
    if n > 1 and interactive:
        raise typer.BadParameter("several answers need a PROMPT (a chat answers each turn once)", param_hint="--n")
    if interactive:
        return None, None
    stdin_media = any("-" in (paths or ()) for paths in given)
    return (prompt, None) if stdin_media else read_prompt(prompt)


def _local_load(chosen, drafting: DraftFlags, ask: Ask, text: str | None):
    """The local engine's load settings: the flags', with the work this prompt will do, the
    draft model, and a sequence per answer with --n."""
    if text is not None:
        chosen = o.one_shot(chosen, text, ask.max_tokens, drafting.draft is not None)
    chosen = drafting.loaded(chosen, ask.offline, ask.model)
    if ask.n > 1:

        chosen = load_for_n(chosen, ask.n)
    return chosen


def _interactive(engine, ask: Ask, name: str, earlier: list, show: ShowFlags, history, conversation_id):
    from tallow.cli.commands.chat import repl
    from tallow.runtime.chat import ChatSettings, Conversation

    conv = Conversation(engine, ChatSettings(ask.sampling, ask.max_tokens, "drop", ask.stop, ask.raw,
                                             reasoning_budget=ask.reasoning_budget), ask.system, earlier)
    return repl(conv, name, show.hide_thinking, history, conversation_id, show_stats=show.stats_line())


def _answer(engine, ask: Ask, name: str, earlier: list, text: str, document: str | None, media: list,
            drafting: DraftFlags, show: ShowFlags, history, conversation_id) -> tuple[FinalEvent | None, list | None]:
    """One answer streamed (or --n answers, shown and logged: None), its JSON and stats line;
    with --mcp, the tool calls made on the way, for the history log."""
    head = ([{"role": "system", "content": ask.system}] if ask.system else []) + earlier
    messages = head + [{"role": "user", "content": with_markers(text, media), "media": media}
                       if media else {"role": "user", "content": text}]
    if ask.mcp is not None:
        return answer_with_mcp(engine, messages, ask.mcp, ask.offline, name, conversation_id, ask.as_json,
                               show.stats_line(ask.as_json), not show.hide_thinking and stderr_is_terminal(),
                               max_tokens=ask.max_tokens, stop=ask.stop,
                               sampling=ask.sampling, raw=ask.raw, reasoning_budget=ask.reasoning_budget)
    # Prefixes worth keeping on disk: the system prompt and history, and a piped document.
    prefixes = ([head] if head else []) + ([head + [{"role": "user", "content": document}]] if document else [])
    request = engine.request(messages, raw=ask.raw, max_tokens=ask.max_tokens, stop=ask.stop, sampling=ask.sampling,
                             cache_prefixes=prefixes, disk_cache=not ask.no_cache, draft=drafting.method(),
                             grammar=ask.grammar, logprobs=ask.logprobs, tools=_tool_choice(engine, ask.tools),
                             reasoning_budget=ask.reasoning_budget)
    for note in request.notes:
        err_console().print(f"note: {note}", soft_wrap=True, markup=False)
    if ask.n > 1:
        _several(engine, request, ask.n, name, conversation_id, history, ask.system, text, ask.as_json, ask.logprobs,
                 show.stats_line(ask.as_json), ask.json_answer, ask.schema)
        return None, None
    tokens: list = []
    final = _stream(engine, request, echo=not ask.as_json and ask.tools is None,
                    show_reasoning=not show.hide_thinking and stderr_is_terminal(),
                    tokens=tokens if ask.logprobs is not None else None)
    if ask.as_json or ask.tools is not None:
        _print_json(engine, ask, name, conversation_id, request, final, tokens)
    if show.stats_line(ask.as_json):  # the JSON has the figures
        err_console().print(stats_line(final), style="dim", soft_wrap=True)
    if final.finish_reason != "interrupted":
        engine.save_prompt(request)  # after everything is shown: saving never delays an answer
    return final, None


def _print_json(engine, ask: Ask, name: str, conversation_id: str, request, final: FinalEvent, tokens: list) -> None:
    out = {"model": name, "text": final.text, "conversation_id": conversation_id, **final.to_dict()}
    if (facts := engine.load_facts()) is not None:
        out["load"] = facts
    if ask.tools is not None:
        out.update(_calls(request, final, _tool_choice(engine, ask.tools)))
    if ask.logprobs is not None:
        out["logprobs"] = {"content": engine.logprob_entries(tokens)}
    sys.stdout.write(json.dumps(out, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def _several(engine, request: Request, n: int, name: str, conversation_id: str, history, system, text,
             as_json: bool, logprobs: int | None, show_stats: bool, json_answer: bool, schema) -> None:
    """--n: the answers whole, in order (text, or one JSON object with `choices` as a batch
    record has them); the stats line of them all; the first answer goes to the history log."""
    from tallow.jobs.batch import record
    from tallow.runtime.scheduling.forks import merged

    choices = answer_n(engine, request, n, logprobs is not None)
    if as_json:
        out = {"model": name, "conversation_id": conversation_id, **record(None, None, choices)}
        del out["id"]
        if (facts := engine.load_facts()) is not None:
            out["load"] = facts
        sys.stdout.write(json.dumps(out, ensure_ascii=False) + "\n")
        sys.stdout.flush()
    else:
        print_choices(choices)
    whole = merged([f for f, _ in choices])
    if show_stats:
        err_console().print(f"{stats_line(whole)} · {n} answers", style="dim", soft_wrap=True)
    log_turn(history, conversation_id, name, system, text, choices[0][0])
    if json_answer:
        for final, _ in choices:
            o.check_structured(final.text, final.finish_reason, schema)


def _read_tools(path: Path, choice: str, fmt: str | None):
    """The tools of a --tools file (OpenAI's chat form, or {name, description, parameters}) and
    the choice, checked as the server checks them."""
    from tallow.wire.fields import tool_list

    try:
        items = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TallowError(f"cannot read the tools in {path}: {exc}", "give a JSON list of function tools") from exc
    if isinstance(items, list):
        items = [t if isinstance(t, dict) and "type" in t else {"type": "function", "function": t} for t in items]
    tools = tool_list(items, "--tools", "chat")
    if not tools:
        raise TallowError(f"{path} lists no tools")
    if choice not in ("auto", "required", "none") and choice not in {t.name for t in tools}:
        raise typer.BadParameter(f"{choice!r} is not auto, required, none or one of the tools", param_hint="--tool-choice")
    return tools, choice, fmt


def _tool_choice(engine, spec):
    from tallow.runtime.tools.choice import ToolChoice

    if spec is None:
        return None
    tools, choice, fmt = spec
    named = choice not in ("auto", "required", "none")
    return ToolChoice(tools, "named" if named else choice, choice if named else None, True, fmt or engine.tool_format())


def _calls(request, final: FinalEvent, choice) -> dict:
    """The answer's content and calls, as a script wants them."""
    from tallow.runtime.answer import Answer

    outcome = Answer(choice).whole(final)
    out = {"content": outcome.content if outcome.content.strip() or not outcome.calls else None,
           "tool_calls": [{"id": cid, "name": n, "arguments": json.loads(a)} for cid, n, a in outcome.calls],
           "finish_reason": outcome.finish_reason}
    if outcome.error:
        out["tool_call_error"] = outcome.error
    return out


def _continued(history, continue_: bool, cid: str | None, system: str | None):
    """(conversation id, earlier messages, system prompt) for --continue / --cid."""
    from tallow.runtime.history import History

    if not (continue_ or cid):
        return History.new_conversation_id(), [], system
    if history is None:
        raise TallowError("there is no history log to continue from", "logging is off (tallow logs on, or unset TALLOW_NO_LOG)")
    cid = cid or history.latest_conversation()
    logged_system, messages, _ = history.messages(cid) if cid else (None, [], None)
    if not messages:
        raise TallowError(f"no logged conversation {cid!r}" if cid else "no logged conversation to continue",
                          "see them: tallow logs")
    return cid, messages, system if system is not None else logged_system


def _stream(engine, request: Request, echo: bool, show_reasoning: bool, tokens: list | None = None) -> FinalEvent:
    """Stream the answer (and reasoning) as it comes; `tokens` collects the token events."""
    out = sys.stdout
    err = err_console() if show_reasoning else None
    events = engine.stream(request)
    final = None
    try:
        try:
            for event in events:
                if isinstance(event, FinalEvent):
                    final = event
                    continue
                if tokens is not None:
                    tokens.append(event)
                if err is not None and event.reasoning:
                    err.print(event.reasoning, style="dim", end="", markup=False)
                if echo and event.text:
                    out.write(event.text)
                    out.flush()
        except KeyboardInterrupt:
            # The engine ends the request and hands back its final record.
            final = events.throw(KeyboardInterrupt)
        if not isinstance(final, FinalEvent):
            raise TallowError("the engine ended without a final record")
        if echo:
            out.write(final.tail + ("\n" if final.text and not final.text.endswith("\n") else ""))
            out.flush()
    except BrokenPipeError:
        # The reader went away (e.g. `| head -1`): stop quietly, as Unix tools do.
        events.close()
        os.dup2(os.open(os.devnull, os.O_WRONLY), out.fileno())
        raise typer.Exit(0) from None
    return final


# -- run --n: several answers to one prompt, the prompt evaluated once (runtime/scheduling/forks.py)

def n_settings(n: int) -> SchedulerSettings:
    """A sequence per answer, in deterministic mode: each answer is what its seed gives,
    whatever the others do and however the steps fall (run --n with a seed reproduces)."""
    return SchedulerSettings(parallel=n, max_queue=n, deterministic=True)


def load_for_n(load: LoadSettings, n: int) -> LoadSettings:
    from tallow.runtime.scheduling.scheduler import load_settings_for

    if load.flash_attn == "off":  # deterministic mode turns it on: refused, not overridden
        raise typer.BadParameter("several answers are decoded in deterministic mode, which needs flash attention",
                                 param_hint="--flash-attn off with --n")

    return load_settings_for(load, n_settings(n))


def answer_n(engine, request: Request, n: int, logprobs: bool) -> list[tuple[FinalEvent, Any]]:
    """The n choices' (final, log-probabilities or None), in order: a scheduler over run's
    engine (loaded with a sequence per choice) forks the prompt's cells to each. Ctrl-C
    cancels them all and exits as an interrupted run does, printing nothing half-done."""
    from tallow.runtime.scheduling.forks import submit_forks
    from tallow.runtime.scheduling.scheduler import Scheduler

    sched = Scheduler(engine, n_settings(n))
    handles: list = []
    try:
        handles = submit_forks(sched, request, n, lambda i: None)
        return [_collect(engine, h, logprobs) for h in handles]
    except KeyboardInterrupt:
        for h in handles:
            h.cancel()
        sys.stderr.write("interrupted\n")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    finally:
        sched.close(keep_engine=True)  # run's `with engine` closes it


def _collect(engine, handle, logprobs: bool) -> tuple[FinalEvent, Any]:
    tokens: list[TokenEvent] = []
    for event in handle.events():
        if isinstance(event, FinalEvent):
            return event, engine.logprob_entries(tokens) if logprobs else None
        if logprobs:
            tokens.append(event)
    raise AssertionError("a handle's events end with its final record")


def print_choices(choices: list[tuple[FinalEvent, Any]]) -> None:
    """Text output: each answer whole, in order, under a line naming it (so a script that
    reads stdout can split them)."""
    for i, (final, _) in enumerate(choices, 1):
        sys.stdout.write(("\n" if i > 1 else "") + f"--- answer {i} of {len(choices)} ---\n")
        sys.stdout.write(final.text + ("" if final.text.endswith("\n") else "\n"))
    sys.stdout.flush()

