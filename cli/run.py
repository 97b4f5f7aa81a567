"""tallow run: one prompt in, a streamed answer out, and what it cost."""

from __future__ import annotations

import json
import os
import sys

import typer

from tallow.models.errors import TallowError
from tallow.runtime.types import FinalEvent, LoadSettings, Request, Sampling

from . import options as o
from . import settings
from .errors import EXIT_INTERRUPTED, EXIT_USAGE
from .models import open_model
from .render import err_console, stats_line, stderr_is_terminal


def read_prompt(prompt: str | None) -> str:
    """PROMPT, with piped stdin put before it. Invalid UTF-8 is replaced, not fatal."""
    piped = ""
    if not sys.stdin.isatty():
        piped = sys.stdin.buffer.read().decode("utf-8", errors="replace")
    text = "\n\n".join(p for p in (piped.strip("\n"), prompt) if p)
    if not text.strip():
        if sys.stdin.isatty():
            raise typer.BadParameter("give a PROMPT (interactive chat is `tallow chat`, not built yet)", param_hint="PROMPT")
        raise typer.BadParameter("the prompt is empty: stdin had no text and no PROMPT was given", param_hint="PROMPT")
    return text


def run(
    model: o.Model,
    prompt: str = typer.Argument(None, help="The prompt. Piped stdin is read and put before it.", show_default=False),
    system: o.System = None,
    temperature: o.Temperature = 0.8,
    top_k: o.TopK = 40,
    top_p: o.TopP = 0.95,
    min_p: o.MinP = 0.05,
    repeat_penalty: o.RepeatPenalty = 1.0,
    seed: o.Seed = None,
    max_tokens: o.MaxTokens = None,
    stop: o.Stop = None,
    ctx: o.Ctx = None,
    threads: o.Threads = None,
    gpu_layers: o.GpuLayers = "auto",
    flash_attn: o.FlashAttn = "auto",
    raw: bool = typer.Option(False, "--raw", help="Send the prompt as is, without the model's chat template."),
    offline: o.Offline = False,
    as_json: o.Json = False,
    stats: bool = typer.Option(False, "--stats", help="Print the stats line even when stderr is not a terminal."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Never print the stats line."),
) -> None:
    """Run a model on one prompt and stream the answer.

    Example: tallow run smollm2:135m "Why is the sky blue?"
    """
    load = LoadSettings(
        n_ctx=ctx, ctx_cap=settings.context_length(), n_threads=threads,
        gpu_layers=o.parse_gpu_layers(gpu_layers), flash_attn=o.parse_flash_attn(flash_attn),
        echo_logs=settings.debug(),
    )
    text = read_prompt(prompt)
    sampling = Sampling(temperature, top_k, top_p, min_p, repeat_penalty, 64, seed)
    name, engine = open_model(model, load, offline=offline or settings.offline())
    with engine:
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
        request = Request(engine.prompt_for(messages, raw=raw), max_tokens, tuple(stop or ()), sampling)
        final = _stream(engine, request, echo=not as_json)
    if as_json:
        out = {"model": name, "text": final.text, **final.to_dict()}
        sys.stdout.write(json.dumps(out, ensure_ascii=False) + "\n")
        sys.stdout.flush()
    if not quiet and (stats or stderr_is_terminal()):
        err_console().print(stats_line(final), style="dim", soft_wrap=True)
    if final.finish_reason == "interrupted":
        raise typer.Exit(EXIT_INTERRUPTED)


def _stream(engine, request: Request, echo: bool) -> FinalEvent:
    out = sys.stdout
    events = engine.stream(request)
    final = None
    try:
        try:
            for event in events:
                if isinstance(event, FinalEvent):
                    final = event
                elif echo and event.text:
                    out.write(event.text)
                    out.flush()
        except KeyboardInterrupt:
            # The engine ends the request and hands back its final record.
            final = events.throw(KeyboardInterrupt)
        if echo:
            out.write(final.tail + ("\n" if final.text and not final.text.endswith("\n") else ""))
            out.flush()
    except BrokenPipeError:
        # The reader went away (e.g. `| head -1`): stop quietly, as Unix tools do.
        events.close()
        os.dup2(os.open(os.devnull, os.O_WRONLY), out.fileno())
        raise typer.Exit(0)
    if final is None:
        raise TallowError("the engine ended without a final record")
    return final
