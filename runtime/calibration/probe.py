"""The calibration child: runs what might crash, and what must be timed, apart from tallow.

    python -m tallow.runtime.calibration.probe JSON

`{"task": "calibrate", "model": PATH, "threads": N, "extra_buffers": BOOL, "timing": BOOL}`
loads the calibration model (runtime/calibration/probe_model.py), decodes a prefill batch and single
tokens with N threads and with one (llama.cpp's repacked kernels have crashed only with
worker threads), and with "timing" measures prefill and decode at two depths with flash
attention on and off, in alternating rounds, and prints every sample (the parent judges
them: runtime/calibration/flash.py). `{"task": "check", "paths": [...]}` asks llama.cpp
to read a model's metadata and plan its buffers without allocating weights (no_alloc).
Either prints one JSON line. A native fault kills only this process: the parent reads the signal.

`"fault"` ("crash" or "hang") makes the child fail the way a native fault would, after
the load: the tests' way to exercise the parent on any CPU.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

DEPTH = 1024  # the "deep" point of the timings
CHUNK = 128  # prefill tokens timed at each depth
SINGLES = 8  # single-token decodes timed at each depth
ROUNDS = 5  # of every measurement, the two modes alternating within each (the parent may ask fewer)
METRICS = ("decode_0", "prefill_0", "prefill_deep", "decode_deep")


def _tokens(n: int, start: int = 0) -> list[int]:
    return [(start + i) * 7 % 480 + 16 for i in range(n)]


def _once(ctx, pos: int, tokens: list[int], single: bool) -> float:
    """Seconds per token of evaluating `tokens` from `pos` (one call, or one call each); the
    context is cut back to `pos` after, so the next try starts where this one did."""
    t0 = time.perf_counter()
    if single:
        for i, t in enumerate(tokens):
            ctx.decode([t], pos + i)
    else:
        ctx.decode(tokens, pos)
    took = (time.perf_counter() - t0) / len(tokens)
    ctx.seq_rm(0, pos)
    return took


def _contexts(backend, model, threads: int, flash: str) -> tuple:
    """A shallow context (empty but one token) and a deep one (DEPTH tokens), for `flash`."""
    def make():
        return backend.Context(model, backend.ContextParams(n_ctx=DEPTH + 2 * CHUNK, n_batch=512, n_ubatch=512,
                                                            n_threads=threads, flash_attn=flash))
    shallow, deep = make(), make()
    shallow.decode(_tokens(1), 0)
    for pos in range(0, DEPTH, 512):
        deep.decode(_tokens(min(512, DEPTH - pos), pos), pos, want_last_logits=False)
    return shallow, deep


def _samples(contexts: dict, rounds: int) -> dict:
    """Every measurement `rounds` times, flash attention on and off alternating in each round
    (the order swapped from round to round), so a busy moment falls on both modes alike."""
    got: dict = {mode: {m: [] for m in METRICS} for mode in contexts}
    modes = list(contexts)
    for r in range(rounds):
        for mode in (modes if r % 2 == 0 else modes[::-1]):
            shallow, deep = contexts[mode]
            got[mode]["decode_0"].append(_once(shallow, 1, _tokens(SINGLES, 1), True))
            got[mode]["prefill_0"].append(_once(shallow, 1, _tokens(CHUNK, 1), False))
            got[mode]["prefill_deep"].append(_once(deep, DEPTH, _tokens(CHUNK, DEPTH), False))
            got[mode]["decode_deep"].append(_once(deep, DEPTH, _tokens(SINGLES, DEPTH), True))
    return got


def _timings(backend, model, threads: int, rounds: int) -> dict:
    """Each mode's samples per measurement (seconds per token; the caller keeps the minimum,
    as a shared machine only ever makes things slower, and reads the noise from the rest)."""
    contexts = {flash: _contexts(backend, model, threads, flash) for flash in ("on", "off")}
    try:
        return _samples(contexts, rounds)
    finally:
        for pair in contexts.values():
            for ctx in pair:
                ctx.close()


def calibrate(args: dict) -> dict:
    from tallow.runtime import backend
    from tallow.runtime.calibration.probe_model import write_probe_model

    backend.init()
    path = Path(args["model"])
    if not path.exists():
        write_probe_model(path)
    threads = int(args["threads"])
    model = backend.Model([path], 0, extra_buffers=bool(args["extra_buffers"]))
    try:
        ctx = backend.Context(model, backend.ContextParams(n_ctx=512, n_batch=128, n_ubatch=128, n_threads=threads))
        if args.get("fault") == "crash":
            os.kill(os.getpid(), signal.SIGSEGV)
        if args.get("fault") == "hang":
            time.sleep(3600)
        ctx.decode(_tokens(100), 0)
        for n in sorted({threads, 1}, reverse=True):  # with worker threads, then with none
            ctx.set_threads(n)
            for i in range(3):
                ctx.decode([_tokens(1, 200 + i)[0]], 100 + 3 * (n != threads) + i)
        ctx.close()
        out: dict = {"ok": True, "system_info": backend.system_info()}
        if args.get("timing"):
            out["samples"] = _timings(backend, model, threads, max(2, int(args.get("rounds", ROUNDS))))
            out["depth"] = DEPTH + CHUNK // 2  # where the deep prefill and decode were timed, about
        return out
    finally:
        model.close()


def check(args: dict) -> dict:
    """llama.cpp's verdict on a model file, without allocating its weights; with "mmproj",
    libmtmd's on the projector bound to that model (it loads the projector's weights)."""
    from tallow.runtime import backend
    from tallow.runtime.errors import BackendError

    backend.init()
    try:
        model = backend.Model([Path(p) for p in args["paths"]], 0, extra_buffers=False, no_alloc=True)
    except BackendError as exc:
        reason = backend.last_log_error() or exc.message
        reason = " ".join(reason.replace("llama_model_load: error loading model:", "").split())
        return {"ok": False, "error": reason}
    try:
        if args.get("mmproj"):
            from tallow.runtime.backend.media import Projector
            from tallow.runtime.media import MARKER

            try:
                Projector(model, Path(args["mmproj"]), 1, MARKER).close()
            except BackendError as exc:
                return {"ok": False, "error": " ".join(exc.message.split()), "part": "projector"}
    finally:
        model.close()
    return {"ok": True}


def main() -> int:
    args = json.loads(sys.argv[1])
    result = calibrate(args) if args["task"] == "calibrate" else check(args)
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
