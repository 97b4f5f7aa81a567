"""n answers to one prompt, the prompt evaluated once: the scheduler forks a sequence after
its prefill (docs/DESIGN.md, "Several answers"). Driven from every route that takes n:
run --n, batch lines and the OpenAI routes."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Callable

from tallow.runtime.types import FinalEvent, Request

if TYPE_CHECKING:  # the wire layer merges usage without loading the engine
    from tallow.runtime.scheduling.handle import Event, Handle
    from tallow.runtime.scheduling.scheduler import Scheduler


def forks(request: Request, n: int) -> list[Request]:
    """n requests for n choices: the first as asked, each other with the next seed (or a
    fresh random one when the request gives none)."""
    seed = request.sampling.seed
    return [request] + [replace(request, sampling=replace(request.sampling, seed=None if seed is None else
                                                          (seed + i) & 0xFFFFFFFF)) for i in range(1, n)]


def submit_forks(sched: Scheduler, request: Request, n: int,
                 on_event: Callable[[int], Callable[[Event], None] | None]) -> list[Handle]:
    """Queue n choices of `request`: the first evaluates the prompt, the others start from a
    copy of its cells. `on_event(i)` is choice i's event callback (None: read its handle's
    events). When one cannot be queued,
    those already queued are cancelled and the error raised."""
    handles: list[Handle] = []
    try:
        for i, fork in enumerate(forks(request, n)):
            handles.append(sched.submit(fork, on_event=on_event(i), fork_of=handles[0] if handles else None))
    except BaseException:
        for h in handles:
            h.cancel()
        raise
    return handles


def merged(finals: list[FinalEvent]) -> FinalEvent:
    """n choices' usage as one answer's: the prompt once (the first fork's, which evaluated
    it), every choice's completion and drafts, the first's timings."""
    first, u = finals[0], replace(finals[0].usage)
    for f in finals[1:]:
        u.completion_tokens += f.usage.completion_tokens
        u.reasoning_tokens += f.usage.reasoning_tokens
        u.draft_tokens += f.usage.draft_tokens
        u.accepted_tokens += f.usage.accepted_tokens
        u.draft_steps += f.usage.draft_steps
    return replace(first, usage=u)
