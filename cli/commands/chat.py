"""tallow chat: a multi-turn conversation in the terminal that never re-reads its history."""

from __future__ import annotations

import os
import re
import sys
from dataclasses import replace

from tallow.cli import options as o
from tallow.cli import presets
from tallow.cli.commands.history_cmds import log_turn, open_history
from tallow.cli.field_flags import with_sampling_flags
from tallow.cli.flag_groups import DraftFlags, EndpointFlags, FormatFlags, LoadFlags, ModelFiles, ShowFlags, with_groups
from tallow.cli.mcp_tools import ChatTools, McpFlags
from tallow.cli.models import open_engine
from tallow.cli.render import err_console, out_console, stats_line
from tallow.common.errors import TallowError
from tallow.env import settings
from tallow.runtime.chat import SETTABLE, ChatSettings, Conversation
from tallow.runtime.types import FinalEvent, NoticeEvent

HELP = """commands:
  /help                 this list
  /clear                start a new conversation (frees its cache)
  /system TEXT          set the system prompt
  /set PARAM VALUE      one of: {params}
  /show                 model, settings, context used
  /image PATH           show the model this image with the next message (needs a projector)
  /audio PATH           let the model hear this audio file with the next message (an audio projector)
  /video PATH [FPS]     show the model this video's frames (FPS a second, 1 if not given) with the next message
  /tools                the MCP servers' tools the model is offered (chat --mcp CONFIG)
  /stats                this conversation: turns, tokens, cache, mean TTFT and decode speed
  /save NAME, /load NAME  keep a conversation, or take one up again
  /edit [TEXT]          write the message in $VISUAL or $EDITOR (Ctrl+G does it with what is typed)
  /bye                  leave (or Ctrl-D)
a message over several lines: start it with \"\"\" and end it with \"\"\"
Ctrl-C stops an answer; at the prompt it clears the line""".format(params=", ".join(SETTABLE))

_SAVE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


@presets.with_preset
@with_sampling_flags
@with_groups(load=LoadFlags, files=ModelFiles, drafting=DraftFlags, show=ShowFlags, shape=FormatFlags, server=EndpointFlags,
             mcp=McpFlags)
def chat(
    model: o.Model,
    system: o.System = None,
    max_tokens: o.MaxTokens = None,
    stop: o.Stop = None,
    raw: o.Raw = False,
    reasoning_budget: o.ReasoningBudget = None,
    think: o.Think = None,
    on_overflow: o.OnOverflow = "drop",
    no_log: o.NoLog = False,
    no_cache: o.NoCache = False,
    offline: o.Offline = False,
    *, sampling_flags: dict, load: LoadFlags, files: ModelFiles, drafting: DraftFlags, show: ShowFlags, shape: FormatFlags,
    server: EndpointFlags, mcp: McpFlags,
) -> None:
    """Chat with a model, reusing the cache turn after turn.

    Each turn evaluates only what is new: the KV cache holds everything said before. With
    --endpoint, a server answers; the history stays here and is logged as usual.

    Example: tallow chat smollm2:135m --system "Answer briefly."
    """
    remote = server.servers(offline)
    mcp.check()
    budget_flags = {"--reasoning-budget": reasoning_budget is not None, "--think": think is not None}
    reasoning_budget = o.thinking(think, reasoning_budget)
    if remote:
        o.refuse_local({**load.given(), **files.given(), **drafting.given(), **mcp.given(), "--no-cache": no_cache,
                        "--on-overflow": on_overflow != "drop", **budget_flags})
    grammar, schema = shape.structured()
    chat_settings = ChatSettings(replace(presets.sampling_base(), **sampling_flags), max_tokens,
                                 o.parse_on_overflow(on_overflow), tuple(stop or ()), raw, drafting.method(),
                                 grammar=grammar, reasoning_budget=reasoning_budget)
    offline = offline or settings.offline()
    local = None if remote else drafting.loaded(o.with_draft(load.settings(files), drafting.draft), offline, model)
    name, engine = open_engine(model, remote, local, offline, not no_cache, shape.format_, schema)
    tools = ChatTools(mcp, offline) if mcp.mcp is not None else None
    try:
        with engine:
            repl(Conversation(engine, chat_settings, system), name, show.hide_thinking, open_history(not no_log),
                 show_stats=show.stats_line(), tools=tools)
    finally:
        if tools is not None:
            tools.close()


def repl(conv: Conversation, name: str, hide_thinking: bool, history, cid: str | None = None,
         show_stats: bool = True, tools: ChatTools | None = None) -> None:
    import readline  # gives input() line editing and arrow-key history

    from tallow.runtime.history import History

    # Ctrl+G: what is typed so far goes to the editor (typed as "/edit TEXT" and sent on).
    readline.parse_and_bind(r'"\C-g": "\C-a/edit \C-j"')

    err = err_console()
    cid = cid or History.new_conversation_id()
    err.print(f"chatting with {name}: /help for commands, Ctrl-D or /bye to leave", style="dim", soft_wrap=True)
    while True:
        try:
            text = _read_message()
        except KeyboardInterrupt:
            sys.stdout.write("\n")  # Ctrl-C at the prompt clears the line
            continue
        except EOFError:
            sys.stdout.write("\n")
            return
        if re.match(r"/edit(\s|$)", text):
            text = _edited(text[6:])
            if not text:
                continue
        elif not text.strip():
            continue
        elif text.startswith("/"):
            result = _command(conv, name, text.strip(), tools)
            if result == "bye":
                return
            if result == "clear":
                cid = History.new_conversation_id()
            continue
        final, calls = tools.turn(conv, text, show_stats, hide_thinking) if tools is not None else \
            (_answer(conv, text, hide_thinking, show_stats), None)
        if final is not None:
            log_turn(history, cid, name, conv.system, text, final, calls)


def _edited(draft: str) -> str:
    """The message as written in $VISUAL or $EDITOR, starting from `draft` and shown once the
    editor closes; empty (nothing to send) when it is left empty or the editor fails."""
    import shlex
    import shutil
    import subprocess
    import tempfile
    from pathlib import Path

    err = err_console()
    editor = os.environ.get("VISUAL") or os.environ.get("EDITOR") or next(
        (e for e in ("editor", "nano", "vi") if shutil.which(e)), None)
    if not editor:
        err.print("error: no editor: set VISUAL or EDITOR", soft_wrap=True)
        return ""
    with tempfile.TemporaryDirectory(prefix="tallow-edit-") as folder:
        path = Path(folder) / "message.md"
        path.write_text(draft, encoding="utf-8")
        try:
            code = subprocess.run([*shlex.split(editor), str(path)], check=False).returncode
        except (OSError, ValueError) as exc:
            err.print(f"error: cannot start the editor {editor!r}: {getattr(exc, 'strerror', None) or exc}",
                      markup=False, soft_wrap=True)
            return ""
        text = path.read_text(encoding="utf-8", errors="replace").strip()
    if code != 0 or not text:
        err.print(f"the editor exited with {code}; nothing sent" if code else "empty: nothing sent", style="dim")
        return ""
    out_console().print(text, markup=False, highlight=False, soft_wrap=True)
    return text


def _read_message() -> str:
    first = input(">>> ")
    if not first.lstrip().startswith('"""'):
        return first
    lines = [first.lstrip()[3:]]
    while not lines[-1].rstrip().endswith('"""'):
        lines.append(input("... "))
    lines[-1] = lines[-1].rstrip()[:-3]
    return "\n".join(lines).strip("\n")


def _answer(conv: Conversation, text: str, hide_thinking: bool, show_stats: bool) -> FinalEvent | None:
    out, err = out_console(), err_console()
    events = conv.ask(text)
    final: object = None
    tokens = []
    try:
        try:
            for event in events:
                if isinstance(event, FinalEvent):
                    final = event
                elif isinstance(event, NoticeEvent):
                    err.print(event.message, style="dim", soft_wrap=True)
                else:
                    _show(out, event.text, event.reasoning, hide_thinking)
                    tokens.append(event)
        except KeyboardInterrupt:
            final = events.throw(KeyboardInterrupt)
        if not isinstance(final, FinalEvent):
            raise TallowError("the engine ended without a final record")
    except (KeyboardInterrupt, StopIteration):
        sys.stdout.write("\n")
        return None
    except Exception as exc:  # noqa: BLE001 - a failed turn must not end the chat
        from tallow.cli.errors import report

        report(exc)
        return None
    _show(out, final.tail, final.reasoning_tail, hide_thinking)
    if final.finish_reason == "interrupted":
        out.print(" [interrupted]", style="dim", end="", markup=False)
    sys.stdout.write("\n")
    sys.stdout.flush()
    if conv.settings.logprobs is not None:  # /set logprobs N: the API's figures, a line a token
        err.print(logprob_lines(conv.engine.logprob_entries(tokens)), style="dim", markup=False, soft_wrap=True)
    if show_stats:  # as for run: on a terminal, or with --stats
        err.print(stats_line(final), style="dim", soft_wrap=True)
    return final


def logprob_lines(entries: list[dict]) -> str:
    """Each answer token with its log-probability and the likeliest alternatives."""
    lines = []
    for e in entries:
        if e["logprob"] is None:
            continue
        alts = ", ".join(f"{t['token']!r} {t['logprob']:.3f}" for t in e["top_logprobs"])
        lines.append(f"  {e['token']!r} {e['logprob']:.3f}" + (f"   [{alts}]" if alts else ""))
    return "\n".join(lines)


def _attach(conv: Conversation, arg: str, say, noun: str = "image") -> None:
    from pathlib import Path

    path, fps = _path_and_rate(arg) if noun == "video" else (arg, 1.0)
    if not path:
        say(f"error: /{noun} needs a PATH" + (" and, if given, a frame rate" if noun == "video" else ""), soft_wrap=True)
        return
    try:
        media, note = _decoded(Path(path).expanduser().read_bytes(), path, noun, fps)
        for item in media:
            conv.attach(item)
    except OSError as exc:
        say(f"error: cannot read the {noun} {path}: {exc.strerror or exc}", markup=False, soft_wrap=True)
        return
    except TallowError as exc:
        say(f"error: {exc}", markup=False, soft_wrap=True)
        return
    first = media[0]
    what = (f"{len(media)} frames" if noun == "video" else f"{first.width / first.rate:.1f} s of audio"
            if noun == "audio" else f"image {first.width}x{first.height}")
    say(f"{what} attached to the next message" + (f" ({note})" if note else ""), style="dim", soft_wrap=True)


def _path_and_rate(arg: str) -> tuple[str, float]:
    """/video's PATH and optional FPS (a last word that is a number)."""
    head, _, last = arg.rpartition(" ")
    try:
        return (head.strip(), float(last)) if head.strip() else (arg, 1.0)
    except ValueError:
        return arg, 1.0


def _decoded(raw: bytes, path: str, noun: str, fps: float) -> tuple[list, str | None]:
    from tallow.runtime.media import decode_image
    from tallow.runtime.media.audio import decode_audio
    from tallow.runtime.media.video import decode_video

    if noun == "video":
        return decode_video(raw, f"the video {path}", fps)
    return [decode_audio(raw, f"the audio {path}") if noun == "audio" else decode_image(raw, f"the image {path}")], None


def _show(out, text: str, reasoning: str, hide_thinking: bool) -> None:
    if reasoning and not hide_thinking:
        out.print(reasoning, style="dim", end="", markup=False)
    if text:
        sys.stdout.write(text)
        sys.stdout.flush()


def _command(conv: Conversation, name: str, line: str, tools: ChatTools | None = None) -> str | None:
    cmd, _, arg = line.partition(" ")
    arg = arg.strip()
    say = err_console().print
    if cmd in ("/bye", "/exit", "/quit"):
        return "bye"
    if cmd == "/help":
        say(HELP, markup=False, soft_wrap=True)
    elif cmd == "/clear":
        conv.clear()
        say("new conversation", style="dim")
        return "clear"
    elif cmd == "/system":
        conv.system = arg or None
        say("system prompt " + ("set" if arg else "cleared"), style="dim")
    elif cmd == "/set":
        param, _, value = arg.partition(" ")
        try:
            conv.set(param, value.strip())
            say(f"{param} = {value.strip()}", style="dim")
        except ValueError as exc:
            say(f"error: {exc}", soft_wrap=True)
    elif cmd == "/show":
        s = conv.settings.sampling
        say(f"model {name}\nsystem {conv.system!r}\ntemperature {s.temperature}, top_k {s.top_k}, top_p {s.top_p}, "
            f"min_p {s.min_p}, repeat_penalty {s.repeat_penalty}, seed {s.seed}, max_tokens {conv.settings.max_tokens}, "
            f"draft {conv.settings.draft or 'off'}, logprobs "
            f"{'off' if conv.settings.logprobs is None else conv.settings.logprobs}\n"
            + (f"context {conv.context_used()} / {conv.engine.n_ctx} tokens" if conv.engine.served_at is None
               else f"context: held by the server at {conv.engine.served_at}"), markup=False, soft_wrap=True)
    elif cmd in ("/image", "/audio", "/video"):
        _attach(conv, arg, say, cmd[1:])
    elif cmd == "/tools":
        say(tools.listing() if tools is not None else "no tools: start the chat with --mcp CONFIG", markup=False,
            soft_wrap=True)
    elif cmd == "/stats":
        st = conv.summary()
        shown = {k: "not reported" if st[k] is None else st[k] for k in ("prompt_tokens", "cached_tokens")}
        say(f"turns {st['turns']} · tokens in {shown['prompt_tokens']} ({shown['cached_tokens']} from cache) · "
            f"out {st['completion_tokens']} ({st['reasoning_tokens']} reasoning) · mean TTFT {st['mean_ttft_ms']:.0f} ms · "
            f"mean decode {st['mean_decode_tps']:.1f} tok/s", soft_wrap=True)
    elif cmd in ("/save", "/load"):
        if not _SAVE_NAME.match(arg):
            say(f"error: {cmd} needs a NAME of letters, digits, '.', '_' or '-'", soft_wrap=True)
            return None
        folder = settings.conversations_dir()
        path = folder / f"{arg}.json"
        try:
            conv.save(path) if cmd == "/save" else conv.load(path)
            say(f"{'saved to' if cmd == '/save' else 'loaded'} {path}", style="dim", soft_wrap=True)
        except FileNotFoundError:
            saved = sorted(p.stem for p in folder.glob("*.json")) if folder.is_dir() else []
            say(f"error: no saved conversation {arg!r}\nhint: " + (f"saved ones: {', '.join(saved)}" if saved else
                "none is saved yet: /save NAME keeps this one"), markup=False, soft_wrap=True)
        except (OSError, ValueError) as exc:
            say(f"error: cannot {cmd[1:]} {path}: {getattr(exc, 'strerror', None) or exc}", markup=False, soft_wrap=True)
    else:
        say(f"unknown command {cmd}; /help lists them", soft_wrap=True)
    return None
