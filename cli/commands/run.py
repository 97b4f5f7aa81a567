"""tallow run: one prompt in, a streamed answer out, and what it cost."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Optional

import typer

from tallow.cli import options as o
from tallow.cli import presets
from tallow.cli.commands.history_cmds import log_turn, open_history
from tallow.cli.errors import EXIT_INTERRUPTED
from tallow.cli.field_flags import with_sampling_flags
from tallow.cli.models import open_engine
from tallow.cli.render import err_console, stats_line, stderr_is_terminal
from tallow.common.errors import TallowError
from tallow.env import settings
from tallow.runtime.media import with_markers
from tallow.runtime.types import FinalEvent, Request


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


@presets.with_preset
@with_sampling_flags
def run(
    model: o.Model,
    prompt: str = typer.Argument(None, help="The prompt. Piped stdin is read and put before it. "
                                 "Without one, on a terminal: an interactive chat.", show_default=False),
    system: o.System = None,
    sampling_flags: dict | None = None,  # a flag for each sampling field of the table (cli/field_flags.py)
    max_tokens: o.MaxTokens = None,
    stop: o.Stop = None,
    ctx: o.Ctx = None,
    threads: o.Threads = None,
    gpu_layers: o.GpuLayers = "auto",
    device: o.Device = None,
    main_gpu: o.MainGpu = 0,
    split_mode: o.SplitMode = "layer",
    tensor_split: o.TensorSplit = None,
    flash_attn: o.FlashAttn = "auto",
    cache_type_k: o.CacheTypeK = "f16",
    cache_type_v: o.CacheTypeV = "f16",
    raw: o.Raw = False,
    image: o.Image = None,
    audio: o.Audio = None,
    mmproj: o.Mmproj = None,
    lora: o.Lora = None,
    reasoning_budget: o.ReasoningBudget = None,
    offline: o.Offline = False,
    as_json: o.Json = False,
    logprobs: Optional[int] = typer.Option(None, "--logprobs", min=0, max=20, help="With --json: each token's log-probability and its N most likely alternatives (as the API's logprobs).", show_default=False),
    stats: o.Stats = False,
    quiet: o.Quiet = False,
    hide_thinking: o.HideThinking = False,
    no_log: o.NoLog = False,
    no_cache: o.NoCache = False,
    draft: o.Draft = None,
    n: int = typer.Option(1, "--n", min=1, max=16, help="Give N answers, each sampled with its own seed (--seed, then the next ones), from one evaluation of the prompt."),
    draft_max: o.DraftMax = 16,
    draft_min: o.DraftMin = 0,
    draft_p_min: o.DraftPMin = 0.75,
    format_: o.Format = None,
    json_schema: o.JsonSchema = None,
    tools_file: Optional[Path] = typer.Option(None, "--tools", help="Offer the tools in this JSON file (a list of OpenAI function tools); prints the answer and its calls as JSON.", show_default=False),
    tool_choice: str = typer.Option("auto", "--tool-choice", help="With --tools: auto, required, none, or a tool's name."),
    tool_format: o.ToolFormat = "auto",
    continue_: bool = typer.Option(False, "--continue", "-c", help="Continue the most recent logged conversation."),
    cid: Optional[str] = typer.Option(None, "--cid", help="Continue the logged conversation with this id.", show_default=False),
    endpoint: o.Endpoint = None,
    api_key: o.EndpointKey = None,
) -> None:
    """Run a model on one prompt and stream the answer.

    With --endpoint, an OpenAI-compatible server answers (MODEL is its name for the model)
    and the stats are measured here.

    Example: tallow run smollm2:135m "Why is the sky blue?"
    """
    if logprobs is not None and not as_json:
        raise typer.BadParameter("log-probabilities are printed in the JSON: add --json", param_hint="--logprobs")
    remote = o.endpoints(endpoint, api_key, offline)
    if remote:
        o.refuse_local({"--device": device is not None, "--main-gpu": main_gpu != 0, "--split-mode": split_mode != "layer",
                        "--tensor-split": tensor_split is not None, "--ctx": ctx is not None, "--threads": threads is not None, "--gpu-layers": gpu_layers != "auto",
                        "--flash-attn": flash_attn != "auto", "--cache-type-k": cache_type_k != "f16",
                        "--cache-type-v": cache_type_v != "f16", "--draft": draft is not None, "--draft-max": o.draft_limits_given(draft_max, draft_min, draft_p_min), "--no-cache": no_cache,
                        "--tools": tools_file is not None, "--tool-format": tool_format != "auto",
                        "--image": bool(image), "--audio": bool(audio),
                        "--mmproj": mmproj is not None, "--n": n > 1, "--lora": bool(lora),
                        "--reasoning-budget": reasoning_budget is not None})
    if n > 1 and tools_file is not None:
        raise typer.BadParameter("several answers with tools are not offered here; give n in a batch line or a request",
                                 param_hint="--n")
    tool_spec = _read_tools(tools_file, tool_choice, o.parse_tool_format(tool_format)) if tools_file is not None else None
    sampling = replace(presets.sampling_base(), **(sampling_flags or {}))
    grammar, schema = o.structured(format_, json_schema)
    history = open_history(not no_log)
    conversation_id, earlier, system = _continued(history, continue_, cid, system)
    media = o.read_media(image, audio)
    interactive = prompt is None and sys.stdin.isatty() and sys.stdout.isatty() and not as_json and tool_spec is None
    if media and prompt is None:
        raise typer.BadParameter(f"{'an image' if image else 'audio'} needs a PROMPT to go with it", param_hint="PROMPT")
    stdin_media = "-" in (image or ()) or "-" in (audio or ())
    if n > 1 and interactive:
        raise typer.BadParameter("several answers need a PROMPT (a chat answers each turn once)", param_hint="--n")
    text, document = (None, None) if interactive else (prompt, None) if stdin_media else read_prompt(prompt)
    if not remote:
        cache_type_k, cache_type_v, flash_attn = o.cache_types(cache_type_k, cache_type_v, flash_attn)
    load = None if remote else o.load_settings(ctx, threads, gpu_layers, flash_attn, cache_type_k, cache_type_v)
    if load is not None:
        load = replace(load, mmproj=o.checked_mmproj(mmproj), loras=o.loras(lora),
                       placement=o.placement(device, main_gpu, split_mode, tensor_split))
    if load is not None and text is not None:
        load = o.one_shot(load, text, max_tokens, draft is not None)
    if load is not None:
        load = o.draft_model(load, draft, offline or settings.offline(), draft_max, draft_min, draft_p_min, model)
    if load is not None and n > 1:  # a sequence per answer
        from tallow.cli.commands.run_n import load_for_n

        load = load_for_n(load, n)
    name, engine = open_engine(model, remote, load, offline or settings.offline(), not no_cache, format_, schema,
                               allow_logprobs=True, projector="needed" if media else "if-stored" if interactive else "no",
                               media={m.kind for m in media})
    with engine:
        if interactive:
            from tallow.cli.commands.chat import repl
            from tallow.runtime.chat import ChatSettings, Conversation

            conv = Conversation(engine, ChatSettings(sampling, max_tokens, "drop", tuple(stop or ()), raw,
                                                     reasoning_budget=reasoning_budget), system, earlier)
            return repl(conv, name, hide_thinking, history, conversation_id,
                        show_stats=not quiet and (stats or stderr_is_terminal()))
        assert text is not None  # read above, since this run is not interactive
        head = ([{"role": "system", "content": system}] if system else []) + earlier
        messages = head + [{"role": "user", "content": with_markers(text, len(media)), "media": media}
                           if media else {"role": "user", "content": text}]
        # Prefixes worth keeping on disk: the system prompt and history, and a piped document.
        prefixes = ([head] if head else []) + ([head + [{"role": "user", "content": document}]] if document else [])
        request = engine.request(messages, raw=raw, max_tokens=max_tokens, stop=tuple(stop or ()), sampling=sampling,
                                 cache_prefixes=prefixes, disk_cache=not no_cache, draft=o.parse_draft(draft),
                                 grammar=grammar, logprobs=logprobs, tools=_tool_choice(engine, tool_spec),
                                 reasoning_budget=reasoning_budget)
        if n > 1:
            return _several(engine, request, n, name, conversation_id, history, system, text, as_json, logprobs,
                            not quiet and (stats or (stderr_is_terminal() and not as_json)), grammar, schema)
        tokens: list = []
        final = _stream(engine, request, echo=not as_json and tool_spec is None,
                        show_reasoning=not hide_thinking and stderr_is_terminal(),
                        tokens=tokens if logprobs is not None else None)
        if as_json or tool_spec is not None:
            out = {"model": name, "text": final.text, "conversation_id": conversation_id, **final.to_dict()}
            if (facts := engine.load_facts()) is not None:
                out["load"] = facts
            if tool_spec is not None:
                out.update(_calls(request, final, _tool_choice(engine, tool_spec)))
            if logprobs is not None:
                out["logprobs"] = {"content": engine.logprob_entries(tokens)}
            sys.stdout.write(json.dumps(out, ensure_ascii=False) + "\n")
            sys.stdout.flush()
        if not quiet and (stats or (stderr_is_terminal() and not as_json)):  # the JSON has the figures
            err_console().print(stats_line(final), style="dim", soft_wrap=True)
        if final.finish_reason != "interrupted":
            engine.save_prompt(request)  # after everything is shown: saving never delays an answer
    log_turn(history, conversation_id, name, system, text, final)
    if final.finish_reason == "interrupted":
        raise typer.Exit(EXIT_INTERRUPTED)
    if grammar is not None:
        o.check_structured(final.text, final.finish_reason, schema)


def _several(engine, request: Request, n: int, name: str, conversation_id: str, history, system, text,
             as_json: bool, logprobs: int | None, show_stats: bool, grammar, schema) -> None:
    """--n: the answers whole, in order (text, or one JSON object with `choices` as a batch
    record has them); the stats line of them all; the first answer goes to the history log."""
    from tallow.cli.commands.run_n import answer_n, print_choices
    from tallow.jobs.batch import record
    from tallow.runtime.forks import merged

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
    if grammar is not None:
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
