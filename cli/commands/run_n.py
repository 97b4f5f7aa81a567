"""run --n: several answers to one prompt, the prompt evaluated once (runtime/scheduling/forks.py)."""

from __future__ import annotations

import sys
from typing import Any

import typer

from tallow.cli.errors import EXIT_INTERRUPTED
from tallow.runtime.types import FinalEvent, LoadSettings, Request, SchedulerSettings, TokenEvent


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

