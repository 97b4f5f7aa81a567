"""How much tallow's engine costs over the bare llama.cpp calls, measured side by side.

Two implementations run the same work in one process, on the same model file, with the
same threads and context size, in paired, alternating rounds (tests/benchmarks/paired.py):

  minimal  a bare loop over the low-level calls: llama_decode + a greedy sampler in C
  tallow   tallow's Engine.stream (templates off, raw tokens in, events out)

and, with --highlevel, llama-cpp-python's high-level Llama.create_completion(stream=True)
against the same minimal loop, for reference (no target).

Same definitions for all: prefill tok/s = prompt tokens / time to the first sampled
token; decode tok/s = (N-1) / time from the first to the last sampled token.
Target: tallow >= 0.97x minimal on pp512, tg128 and the long decode. Exits 1 when one is
missed, 3 when the machine was too noisy to say.

    python tests/benchmarks/overhead.py [--model PATH] [--rounds 7] [--long 4096] [--highlevel]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

N_PROMPT = 512
THREADS = 2


def default_model() -> Path:
    from helpers.processes import shared_home

    from tallow.models.catalog import SMOLLM2_135M
    from tallow.models.resolve import locate
    from tallow.models.store import Store

    found = locate(SMOLLM2_135M.name, Store(shared_home() / "models"))
    if not hasattr(found, "path"):
        sys.exit("run the tests once first (they fetch the default model), or pass --model PATH")
    return found.path


def prompt_tokens(engine, n: int, salt: int) -> list[int]:
    text = f"Report {salt}. " + " ".join(f"The river number {i} runs past hill {i * 7 % 13}." for i in range(400))
    tokens = engine.tokenize(text)
    assert len(tokens) >= n
    return tokens[:n]


class Minimal:
    """The least Python a decode loop can have: one llama_decode per token, greedy in C."""

    def __init__(self, path: Path, n_ctx: int, extra_buffers: bool) -> None:
        import llama_cpp.llama_cpp as C

        self.C = C
        mp = C.llama_model_default_params()
        mp.use_extra_bufts = extra_buffers  # as tallow decided for this CPU
        self.model = C.llama_model_load_from_file(str(path).encode(), mp)
        cp = C.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch = n_ctx, 512, 512
        cp.n_threads = cp.n_threads_batch = THREADS
        cp.flash_attn_type = C.LLAMA_FLASH_ATTN_TYPE_AUTO
        cp.no_perf = True
        self.ctx = C.llama_init_from_model(self.model, cp)
        vocab = C.llama_model_get_vocab(self.model)
        eog = [t for t in range(C.llama_vocab_n_tokens(vocab)) if C.llama_vocab_is_eog(vocab, t)]
        self.chain = C.llama_sampler_chain_init(C.llama_sampler_chain_default_params())
        bias = (C.llama_logit_bias * len(eog))(*[C.llama_logit_bias(t, float("-inf")) for t in eog])
        C.llama_sampler_chain_add(self.chain, C.llama_sampler_init_logit_bias(C.llama_vocab_n_tokens(vocab), len(eog), bias))
        C.llama_sampler_chain_add(self.chain, C.llama_sampler_init_greedy())

    def run(self, prompt: list[int], n_gen: int) -> tuple[float, float]:
        C = self.C
        C.llama_memory_clear(C.llama_get_memory(self.ctx), True)
        t0 = time.perf_counter()
        arr = (C.llama_token * len(prompt))(*prompt)  # must outlive llama_decode
        assert C.llama_decode(self.ctx, C.llama_batch_get_one(arr, len(prompt))) == 0
        one = (C.llama_token * 1)()
        tok = C.llama_sampler_sample(self.chain, self.ctx, -1)
        t_first = time.perf_counter()
        for _ in range(n_gen - 1):
            one[0] = tok
            assert C.llama_decode(self.ctx, C.llama_batch_get_one(one, 1)) == 0
            tok = C.llama_sampler_sample(self.chain, self.ctx, -1)
        t_last = time.perf_counter()
        return len(prompt) / (t_first - t0), (n_gen - 1) / (t_last - t_first)


class Tallow:
    def __init__(self, path: Path, n_ctx: int) -> None:
        from tallow.runtime.engine import Engine
        from tallow.runtime.types import LoadSettings

        self.engine = Engine(path, LoadSettings(n_ctx=n_ctx, n_threads=THREADS))

    def run(self, prompt: list[int], n_gen: int) -> tuple[float, float]:
        from tallow.runtime.types import Request, Sampling, TokenEvent

        self.engine.reset()
        t0 = time.perf_counter()
        t_first = t_last = None
        n = 0
        for ev in self.engine.stream(Request(prompt, n_gen, (), Sampling(temperature=0), ignore_eos=True)):
            if isinstance(ev, TokenEvent):
                t_last = time.perf_counter()
                t_first = t_first or t_last
                n += 1
        assert n == n_gen
        return len(prompt) / (t_first - t0), (n_gen - 1) / (t_last - t_first)


class HighLevel:
    def __init__(self, path: Path, n_ctx: int, extra_buffers: bool) -> None:
        from helpers.highlevel import high_level_llama

        self.llm = high_level_llama(path, extra_buffers, n_ctx=n_ctx, n_threads=THREADS, n_threads_batch=THREADS,
                                    n_batch=512)
        self.eog = {t: float("-inf") for t in range(self.llm.n_vocab()) if self.llm._model.token_is_eog(t)} if hasattr(self.llm._model, "token_is_eog") else {self.llm.token_eos(): float("-inf")}

    def run(self, prompt: list[int], n_gen: int) -> tuple[float, float]:
        self.llm.reset()
        self.llm._ctx.kv_cache_clear() if hasattr(self.llm._ctx, "kv_cache_clear") else None
        t0 = time.perf_counter()
        t_first = t_last = None
        n = 0
        for _ in self.llm.create_completion(prompt, max_tokens=n_gen, temperature=0.0, stream=True, logit_bias=self.eog):
            t_last = time.perf_counter()
            t_first = t_first or t_last
            n += 1
        n = max(n, 2)
        return len(prompt) / (t_first - t0), (n - 1) / (t_last - t_first)


def main() -> int:
    from benchmarks.paired import Comparison, compare, compare_two, exit_code

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--long", type=int, default=4096, help="output tokens of the long decode test (0 to skip)")
    ap.add_argument("--highlevel", action="store_true", help="also llama-cpp-python's high-level API, for reference")
    args = ap.parse_args()
    path = args.model or default_model()
    n_ctx = N_PROMPT + max(128, args.long) + 16
    tallow = Tallow(path, n_ctx)  # first: it installs the log callback that keeps llama.cpp quiet
    repack = tallow.engine.extra_buffers  # the same weights on every side
    minimal = Minimal(path, n_ctx, repack)
    salt = iter(range(1, 1_000_000))

    def pair(subject, n_gen: int):
        def measure(arm: str) -> tuple[float, float]:
            return (subject if arm == "subject" else minimal).run(prompt_tokens(tallow.engine, N_PROMPT, next(salt)),
                                                                  n_gen)
        return measure

    print(f"model {path}, {THREADS} threads, ctx {n_ctx}, flash attention auto, "
          f"repacked weights {'on' if repack else 'off'}; subject tallow, reference the minimal loop")
    verdicts = compare_two(Comparison("pp512", pair(tallow, 128), 0.97, False, args.rounds, unit=" tok/s"),
                           Comparison("tg128", lambda arm: 0.0, 0.97, False))
    if args.long:
        rounds = max(3, args.rounds // 2)
        verdicts.append(compare(Comparison(f"tg{args.long}", lambda arm: pair(tallow, args.long)(arm)[1], 0.97, False,
                                           rounds, max_rounds=rounds, unit=" tok/s")))
    if args.highlevel:  # for reference: what the bindings' own high-level API costs
        compare_two(Comparison("llama-cpp-python pp512", pair(HighLevel(path, n_ctx, repack), 128), 0.0, False,
                               args.rounds, max_rounds=args.rounds, unit=" tok/s"),
                    Comparison("llama-cpp-python tg128", lambda arm: 0.0, 0.0, False))
    return exit_code(verdicts)


if __name__ == "__main__":
    sys.exit(main())
