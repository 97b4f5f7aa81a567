"""One scheduler step's llama_decode calls (runtime/scheduling/scheduler.py): the decoding rows, drafts,
and prefill chunks, packed by sequence; and the batch-invariant way of packing them, for a
deterministic scheduler and for every request that gives a seed (docs/DESIGN.md, "Scheduler,
KV layout and batch invariance").

A request is batch-invariant ("steady" below) when its rows never depend on what else is in
the step or in the cache: its prefill goes in chunks of at most DET_CHUNK tokens, each in a
call of its own and never a single row, and a decoding sequence with no neighbour brings its
previous token again (`pair`). Cold, warm from memory, warm from disk, alone or beside other
streams: the same rows, the same rounding, the same answer for a seed."""

from __future__ import annotations

from typing import Any

from tallow.runtime.drafting.draft_model import propose_all
from tallow.runtime.media.prefill import next_span, span_at
from tallow.runtime.scheduling.admission import prefill_order

DET_CHUNK = 63  # below flash attention's tiled kernel (64 query rows), which rounds differently

Entry = tuple[int, int, int, bool]  # (token, position, sequence id, wants logits)


def steady(sched, job) -> bool:
    """Whether `job`'s rows are packed the batch-invariant way: a deterministic scheduler's
    all are, and a request's that gives its own seed (its answer must not depend on cache)."""
    return sched.settings.deterministic or job.request.sampling.seed is not None and job.request.sampling.temperature > 0


def by_sequence(entries: list[Entry], wants: list[tuple[int, Any]]):
    """A call's rows grouped by sequence id in ascending order, each sequence's rows in their
    own order, and the rows to sample renumbered to match. With a KV stream per sequence
    llama.cpp splits a batch into runs of consecutive sequence ids, so rows in admission order
    (a new prompt's after the decoding ones) cost a micro-batch per run: 8 rows decoded
    shuffled took 82 ms, sorted 63 ms, on the default model."""
    order = sorted(range(len(entries)), key=lambda i: entries[i][2])
    where = {old: new for new, old in enumerate(order)}
    return [entries[i] for i in order], [(where[row], job) for row, job in wants]


def drafts(sched, decoding: list, spare: int) -> dict[int, list[int]]:
    """This step's drafts, by job (runtime/drafting/draft_model.propose_all)."""
    jobs = [job for job in decoding if job.drafter is not None]
    rooms = [(job.drafter, min(job.limit - len(job.held.kv) - 1, spare)) for job in jobs]
    # deterministic mode: a sequence's drafts (hence its rows) never depend on how many others decode
    busy = 1 if sched.settings.deterministic else len(decoding)
    return {id(job): d for job, d in zip(jobs, propose_all(rooms, sched.engine.drafts, busy))}


def plan_calls(sched, active: list) -> list[tuple[list[Entry], list[tuple[int, Any]]]]:
    """This step's llama_decode calls for `active` (one adapter set's jobs): (entries,
    [(row, job) to sample])."""
    decode: list[Entry] = []
    wants: list[tuple[int, Any]] = []
    decoding = sorted((j for j in active if j.next_token is not None), key=lambda j: j.held.seq)
    seqs = {j.held.seq for j in decoding}
    spare = max(0, (sched.n_batch - 2 * len(decoding)) // max(1, len(decoding)))  # draft room each
    planned = drafts(sched, decoding, spare)
    for job in decoding:
        slot = job.held
        job.draft = planned.get(id(job), [])
        # With a KV stream per sequence, llama.cpp splits a batch into runs of consecutive
        # sequence ids; a sequence alone in its run brings two tokens (see pair).
        if steady(sched, job) and not job.draft and slot.seq - 1 not in seqs and slot.seq + 1 not in seqs:
            pair(sched.engine.ctx, slot, decode)
        wants.append((len(decode), job))
        assert job.next_token is not None  # sorted into `decoding` for having one
        for token in (job.next_token, *job.draft):  # a draft's rows follow the token's
            decode.append((token, slot.sequence.next_pos, slot.seq, True))
            slot.kv.append(token)
        job.next_token = None
    separate = _prefill(sched, active, decode, wants)
    return ([by_sequence(decode, wants)] if decode else []) + separate


def _prefill(sched, active: list, decode: list[Entry], wants: list) -> list:
    """The prefill chunks of this step: a steady request's each in a call of its own
    (returned), the others' added to `decode`, the step's one call."""
    separate = []
    budget = sched.n_batch - len(decode)
    det = sched.settings.deterministic
    waiting = list(active) if det else prefill_order(active)  # det: the chunks' own rule (DET_CHUNK)
    for i, job in enumerate(waiting):
        prompt, slot = job.request.prompt_tokens, job.held
        start = len(slot.kv)
        if job.run.t_decode_start is not None or start >= len(prompt):
            continue
        if (span := span_at(job.request.media, start)) is not None:
            if not sched.media_ready(job, span):
                continue  # encoding on the worker; the others go on
            start = len(slot.kv)
        fixed = steady(sched, job)
        if budget < (2 if fixed else 1):
            break
        chunk: list[Entry] = []
        if fixed and len(prompt) - start == 1 and start > 0:
            pair(sched.engine.ctx, slot, chunk)
        room = budget - len(chunk)
        room = min(room, DET_CHUNK) if fixed else max(1, room // (len(waiting) - i))  # else a fair share
        n = min(room, len(prompt) - start, *(p - start for p in [job.stops.next()] if p is not None),  # a stop
                *(p - start for p in [next_span(job.request.media, start)] if p is not None))  # and at media
        base = slot.sequence.pos(start) - start
        for k in range(start, start + n):
            # a steady request asks for two output rows: see pair
            chunk.append((prompt[k], base + k, slot.seq, k == len(prompt) - 1 or (fixed and k == len(prompt) - 2)))
        slot.kv.extend(prompt[start:start + n])
        budget -= len(chunk)
        done = start + n == len(prompt)
        if fixed:  # alone in its call, llama.cpp cannot split it into a one-token micro-batch
            separate.append((chunk, [(len(chunk) - 1, job)] if done else []))
        else:  # with everything else, in the one call of this step
            if done:
                wants.append((len(decode) + len(chunk) - 1, job))
            decode.extend(chunk)
    return separate


def pair(ctx, slot, entries: list) -> None:
    """Re-evaluate the sequence's last token alongside the next one, both with logits, so
    that no matrix product ever has a single row: llama.cpp multiplies one row with a
    different kernel (ggml's vec_dot) than several (llamafile's sgemm), the two round
    differently, and the last layer and the output matrix run on the output rows only.
    The re-evaluated cell gets the very values it had."""
    p = len(slot.kv) - 1
    if slot.kv[p] < 0 or not ctx.rewinds:  # a media cell, a recurrent state: no second evaluation
        return
    at = slot.sequence.pos(p)
    ctx.seq_rm(slot.seq, at, -1)
    entries.append((slot.kv[p], at, slot.seq, True))  # slot.kv already lists it
