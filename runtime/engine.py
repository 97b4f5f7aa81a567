"""The engine: load a model, build prompts, and stream a request as typed events.

One long-lived sequence (seq 0) keeps the tokens its KV cells hold, so a request
whose prompt starts with them evaluates only what follows the common prefix.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator

from tallow.models.errors import TallowError

from .errors import ContextOverflow
from .loadplan import (choose_flash_attn, context_notes, default_context, extra_buffers, gpu_layer_count, plan_memory,
                       read_shape)
from .logprobs import with_logprobs
from .threads import Governor, Registry, physical_cores
from .text import Detokenizer, ReasoningSplitter, StopMatcher, opens_reasoning, reasoning_markers
from .types import FinalEvent, LoadSettings, Request, Timings, TokenEvent, Usage

_SEQ = 0


class Engine:
    def __init__(self, path: Path | list[Path], settings: LoadSettings) -> None:
        """Load a model file (or the shards of one, in order)."""
        from . import backend

        started = time.perf_counter()
        backend.init(echo_logs=settings.echo_logs)
        paths = [Path(p) for p in path] if isinstance(path, list) else [Path(path)]
        self.path = paths[0]
        offload = backend.supports_gpu_offload()
        self.fit_note = self.estimate = None
        shape = read_shape(paths) if settings.check_memory or settings.flash_attn == "auto" else None
        self.flash_attn = choose_flash_attn(settings, shape)
        self.extra_buffers = extra_buffers(settings)
        settings = replace(settings, flash_attn=self.flash_attn)
        if settings.check_memory:  # before anything is allocated
            from .devices import gpu_free_memory

            vram = settings.vram if settings.vram is not None else (gpu_free_memory() if offload else None)
            plan = plan_memory(paths, settings, offload, vram, shape)
            if plan.problem is not None:
                raise plan.problem
            n_ctx, layers, self.estimate, self.fit_note = plan.n_ctx, plan.gpu_layers, plan.estimate, plan.note
        else:
            n_ctx, layers = None, gpu_layer_count(settings.gpu_layers, offload)
        pinned = settings.n_threads or (None if settings.adapt_threads else physical_cores())
        self.governor = Governor(physical_cores(), pinned, Registry(settings.registry) if settings.registry else None)
        self.model = backend.Model(paths, layers, extra_buffers=self.extra_buffers)
        try:
            if n_ctx is None:
                n_ctx = default_context(settings, self.model.n_ctx_train)
            n_threads = self.governor.start()
            self.ctx = backend.Context(
                self.model,
                backend.ContextParams(n_ctx=n_ctx, n_batch=settings.n_batch, n_ubatch=settings.n_batch,
                                      n_threads=n_threads, flash_attn=settings.flash_attn,
                                      observer=settings.observer, type_k=settings.type_k,
                                      type_v=settings.type_v, n_seq_max=settings.n_seq_max,
                                      kv_unified=settings.kv_unified),
            )
        except BaseException:
            self.governor.close()
            self.model.close()
            raise
        self.n_ctx = self.ctx.n_ctx
        self.n_batch = self.ctx.n_batch
        # what the user should hear about this load: a context shrunk to fit, rounded, too long
        self.notes = [self.fit_note] if self.fit_note else []
        self.notes += context_notes(settings.n_ctx, self.n_ctx, settings.n_seq_max, self.model.n_ctx_train,
                                    self.model.meta)
        self.kv: list[int] = []  # tokens whose KV cells seq 0 holds, in position order
        self._template = None
        self._settings = settings
        self._disk = None  # (PromptCache, fingerprint) once attached
        self.load_ms = (time.perf_counter() - started) * 1000

    # -- prompts ---------------------------------------------------------------------------
    def chat_template(self):
        if self._template is None:
            from .template import ChatTemplate

            src = self.model.chat_template()
            if src is None:
                return None
            piece = lambda t: self.model.piece(t).decode("utf-8", "replace") if t >= 0 else ""  # noqa: E731
            self._template = ChatTemplate(src, piece(self.model.bos), piece(self.model.eos))
        return self._template

    def prompt_for(self, messages: list[dict[str, Any]], raw: bool = False) -> list[int]:
        """Tokens for a conversation: through the model's chat template, or plain text when raw
        (or when the model has none)."""
        template = None if raw else self.chat_template()
        if template is None:
            text = "\n\n".join(m["content"] for m in messages)
            return self.model.tokenize(text, add_special=True, parse_special=False)
        text = template.render(messages, add_generation_prompt=True)
        tokens = self.model.tokenize(text, add_special=False, parse_special=True)
        if self.model.add_bos and (not tokens or tokens[0] != self.model.bos):
            tokens.insert(0, self.model.bos)
        return tokens

    def request(self, messages: list[dict[str, Any]], *, raw: bool = False,
                cache_prefixes: list[list[dict[str, Any]]] = (), **kw) -> Request:
        """A Request for a conversation, knowing the model's reasoning markers. Each of
        `cache_prefixes` (a shorter conversation: the system prompt alone, a document
        without the question) marks where a prefix worth keeping on disk ends."""
        template = None if raw else self.chat_template()
        markers = reasoning_markers(template.source) if template else None
        tokens = self.prompt_for(messages, raw=raw)
        inside = False
        if markers:
            tail = self.model.detokenize(tokens[-16:]).decode("utf-8", "replace")
            inside = opens_reasoning(tail, markers)
        points = []
        for prefix in cache_prefixes:
            rendered = self._render_prefix(prefix, raw)
            points.append(common_prefix(rendered, tokens))
        return Request(tokens, reasoning_markers=markers, starts_in_reasoning=inside, cache_points=tuple(points), **kw)

    def _render_prefix(self, messages: list[dict[str, Any]], raw: bool) -> list[int]:
        template = None if raw else self.chat_template()
        if template is None:
            return self.prompt_for(messages, raw=True)
        return self.model.tokenize(template.render(messages, add_generation_prompt=False), add_special=False,
                                   parse_special=True)

    # -- the disk cache of prompt prefixes ---------------------------------------------------
    def use_prompt_cache(self, cache, model_sha256: str) -> None:
        """Attach a PromptCache; states are keyed by everything that shapes the KV contents."""
        from .prompt_cache import fingerprint

        s = self._settings
        self._disk = (cache, fingerprint({
            "model": model_sha256, "n_ctx": self.n_ctx, "n_batch": self.n_batch, "type_k": s.type_k, "type_v": s.type_v,
            "flash_attn": self.flash_attn, "rope": "model", "n_seq_max": s.n_seq_max, "llama_cpp": self._backend_version(),
            "extra_buffers": self.extra_buffers,
        }))

    @staticmethod
    def _backend_version() -> str:
        from importlib.metadata import version

        return version("llama-cpp-python")

    def _load_from_disk(self, run: RequestState, prompt: list[int], cached: int) -> int:
        """Load the longest saved prefix that beats what memory holds; returns tokens cached."""
        cache, fp = self._disk
        for entry in cache.lookup(fp, prompt):  # longest first; a damaged one is removed and the next tried
            if len(entry.tokens) <= cached + 1:
                break
            if not cache.verify(entry):
                continue
            self.ctx.seq_rm(_SEQ, 0, -1)
            self.kv.clear()
            loaded = self.ctx.load_seq(entry.state_path, _SEQ, len(entry.tokens))
            if loaded != entry.tokens:  # refused or not what the record says: never use it
                self.ctx.seq_rm(_SEQ, 0, -1)
                cache.remove(entry)
                run.usage.cache_source = None
                cached = 0  # what memory held is gone with the failed load
                continue
            self.kv.extend(loaded)
            cache.touch(entry)
            run.usage.cache_source = "disk"
            return min(len(loaded), len(prompt) - 1)
        return cached

    def save_prompt(self, request: Request) -> int:
        """Save the request's prompt, and its cache points, to the disk cache (after the
        answer, so it never delays one). Returns how many entries were written.

        The KV cache is trimmed to each prefix in turn, longest first, and saved: a
        one-shot run ends here anyway, and a single unified-free sequence keeps decoding
        fastest (a scratch sequence would need llama.cpp's unified KV buffer, which costs
        a few percent of decode speed). Afterwards the cache holds the shortest prefix saved.
        """
        if self._disk is None or not request.disk_cache or not request.save_prompt:
            return 0
        cache, fp = self._disk
        prompt = request.prompt_tokens
        written = 0
        # The whole prompt but its last token: a later run loads it and evaluates that token
        # into the very next cell, exactly as this run did (no hole left by trimming the
        # KV, which would shift llama.cpp's summation order and, at temperature 0, the answer).
        for n in sorted({*request.cache_points, len(prompt) - 1}, reverse=True):
            tokens = prompt[:n]
            if n < cache.min_tokens or self.kv[:n] != tokens or cache.has(fp, tokens):
                continue
            self.ctx.seq_rm(_SEQ, n, -1)
            del self.kv[n:]
            written += cache.put(fp, tokens, lambda path: self.ctx.save_seq(path, _SEQ, tokens)) is not None
        return written

    def tokenize(self, text: str, special: bool = False) -> list[int]:
        return self.model.tokenize(text, add_special=special, parse_special=special)

    # -- generation --------------------------------------------------------------------------
    def stream(self, request: Request) -> Iterator[TokenEvent | FinalEvent]:
        """Yield a TokenEvent per sampled token, then exactly one FinalEvent.

        KeyboardInterrupt, raised in here or thrown in by the consumer with
        `.throw(KeyboardInterrupt)`, ends the request with finish_reason 'interrupted'
        and still yields the final record (the answer and timings so far).
        """
        prompt = list(request.prompt_tokens)
        if not prompt:
            raise ContextOverflow("the prompt is empty", "give a prompt, or pipe text on stdin")
        if len(prompt) >= self.n_ctx:
            raise ContextOverflow(
                f"the prompt is {len(prompt)} tokens but the context holds {self.n_ctx} (one more is needed to answer)",
                "shorten the prompt or raise --ctx",
            )
        run = RequestState(request, Timings(load_ms=self.load_ms), Usage(prompt_tokens=len(prompt)))
        try:
            yield from self._generate(run, prompt)
        except KeyboardInterrupt:
            run.finish = "interrupted"
        yield run.final()

    def _prefill(self, run: RequestState, prompt: list[int]) -> None:
        cached = common_prefix(self.kv, prompt)
        if cached == len(prompt):
            cached -= 1  # the last prompt token must be evaluated again to get its logits
        run.usage.cache_source = "memory" if cached else None
        if self._disk is not None and run.request.disk_cache:
            cached = self._load_from_disk(run, prompt, cached)
        self.ctx.seq_rm(_SEQ, cached, -1)
        del self.kv[cached:]
        run.usage.cached_tokens = cached
        todo = prompt[cached:]
        # A prompt that will be saved to disk gets its last token evaluated alone, as a later
        # run that loads the saved state must: llama.cpp's logits differ in the last bits
        # between batch sizes, and at temperature 0 that could change the answer.
        split = (self._disk is not None and run.request.disk_cache and run.request.save_prompt
                 and len(prompt) >= self._disk[0].min_tokens)
        body = todo[: len(todo) - split] if todo else todo
        chunks = [body[i:i + self.n_batch] for i in range(0, len(body), self.n_batch)]
        if split and todo:
            chunks.append(todo[-1:])
        # Chunks of n_batch keep Ctrl-C responsive during a long prefill and bound memory.
        for n, chunk in enumerate(chunks):
            self.ctx.decode(chunk, len(self.kv), _SEQ, want_last_logits=n == len(chunks) - 1)
            self.kv.extend(chunk)
        run.timings.prefill_tokens = len(todo)

    def sampler_for(self, request: Request):
        """A C sampler chain for the request's settings (the caller closes it)."""
        from .backend import Sampler, SamplerParams

        s = request.sampling
        banned = self.model.eog_tokens() if request.ignore_eos else ()
        return Sampler(self.model, SamplerParams(s.temperature, s.top_k, s.top_p, s.min_p, s.repeat_penalty,
                                                 s.repeat_last_n, s.resolved_seed(), banned, request.grammar,
                                                 s.frequency_penalty, s.presence_penalty))

    def _generate(self, run: RequestState, prompt: list[int]) -> Iterator[TokenEvent]:
        s = run.request.sampling
        sampler = self.sampler_for(run.request)
        try:
            t0 = run.started
            self._prefill(run, prompt)
            if s.penalized:
                for t in prompt[-s.repeat_last_n:]:
                    sampler.accept(t)
            t_prefill = time.perf_counter()
            run.timings.prefill_ms = (t_prefill - t0) * 1000
            run.t_decode_start = t_prefill
            yield from self._decode_loop(run, sampler)
        finally:
            sampler.close()

    def _decode_loop(self, run: RequestState, sampler) -> Iterator[TokenEvent]:
        if run.request.draft == "lookup":
            from .speculative import lookup_decode

            if run.request.logprobs is not None:
                raise TallowError("log-probabilities do not combine with --draft lookup yet",
                                  "leave out one of them")

            yield from lookup_decode(self, run, sampler)
            return
        ctx, kv, take = self.ctx, self.kv, self.take
        top = run.request.logprobs
        while True:
            token = sampler.sample(ctx, -1)
            event, done = take(run, token)
            if event is not None:
                if top is not None:  # read before the next decode replaces the logits
                    event = with_logprobs(event, ctx.logit_row(-1, self.model.n_vocab), top)
                yield event
            if done:
                return
            if len(kv) >= self.n_ctx:
                run.finish = "length"  # the context is full
                return
            self.pace()
            ctx.decode([token], len(kv), _SEQ)
            kv.append(token)

    def take(self, run: RequestState, token: int) -> tuple[TokenEvent | None, bool]:
        """Account for one sampled token: (its event, whether the answer is over)."""
        now = time.perf_counter()
        if self.model.is_eog(token):
            run.finish = "stop"
            return None, True
        if run.t_last is None:
            run.timings.ttft_ms = (now - run.started) * 1000
        else:
            run.timings.itl_ms.append((now - run.t_last) * 1000)
        run.t_last = now
        run.n_out += 1
        text, stopped = run.stops.push(run.detok.push(self.model.piece(token)))
        reasoning = ""
        if run.splitter is not None:
            text, reasoning, touched = run.splitter.push(text)
            run.usage.reasoning_tokens += touched
            if reasoning:
                run.reasoning_parts.append(reasoning)
        if text:
            run.parts.append(text)
        if stopped:
            run.finish, run.hit_stop_string = "stop", True
            return TokenEvent(text, token, reasoning), True
        max_tokens = run.request.max_tokens
        if max_tokens is not None and run.n_out >= max_tokens:
            run.finish = "length"
            return TokenEvent(text, token, reasoning), True
        return TokenEvent(text, token, reasoning), False

    def logits_for(self, tokens: list[int]):
        """Logits at every position of `tokens`, evaluated from an empty cache (for perplexity
        and KL divergence): a (len(tokens), n_vocab) float32 array."""
        import numpy as np

        if len(tokens) > self.n_ctx:
            raise ContextOverflow(f"{len(tokens)} tokens do not fit in the context of {self.n_ctx}")
        self.reset()
        rows = []
        for i in range(0, len(tokens), self.n_batch):
            chunk = tokens[i:i + self.n_batch]
            self.ctx.decode(chunk, i, _SEQ, all_logits=True)
            rows.append(self.ctx.logits(len(chunk), self.model.n_vocab))
        self.reset()
        return np.concatenate(rows)

    def reset(self) -> None:
        """Forget every cached token (the next prompt is evaluated in full)."""
        self.ctx.clear()
        self.kv.clear()

    @property
    def n_threads(self) -> int:
        """The threads decoding now (runtime/threads.py may change them between steps)."""
        return self.ctx.n_threads

    def pace(self) -> None:
        """Once per decode step, by every decode loop: follow the cores free (runtime/threads.py)."""
        self.governor.pace(self.ctx)

    def close(self) -> None:
        self.governor.close()
        self.ctx.close()
        self.model.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class RequestState:
    """The mutable state of one request while it streams: the output stream (detokenizer, stop
    strings, reasoning split) and its usage and timings. Public: the scheduler drives one per slot."""

    def __init__(self, request: Request, timings: Timings, usage: Usage) -> None:
        self.request = request
        self.timings = timings
        self.usage = usage
        self.started = time.perf_counter()
        self.t_decode_start: float | None = None
        self.t_last: float | None = None
        self.n_out = 0
        self.parts: list[str] = []
        self.finish = "stop"
        self.hit_stop_string = False
        self.detok = Detokenizer()
        self.stops = StopMatcher(list(request.stop))
        markers = request.reasoning_markers
        self.splitter = ReasoningSplitter(*markers, inside=request.starts_in_reasoning) if markers else None
        self.reasoning_parts: list[str] = []

    def final(self) -> FinalEvent:
        tail = reasoning_tail = ""
        if not self.hit_stop_string:
            # Release what was held back: an incomplete character, a possible stop prefix.
            tail, stopped = self.stops.push(self.detok.flush())
            if not stopped:
                tail += self.stops.flush()
        if self.splitter is not None:
            answer, reasoning_tail, _ = self.splitter.push(tail)
            held_answer, held_reasoning = self.splitter.flush()
            tail, reasoning_tail = answer + held_answer, reasoning_tail + held_reasoning
            self.reasoning_parts.append(reasoning_tail)
        self.parts.append(tail)
        t = self.timings
        t.decode_tokens = self.n_out
        if self.t_decode_start is not None and self.t_last is not None:
            t.decode_ms = (self.t_last - self.t_decode_start) * 1000
        t.total_ms = (time.perf_counter() - self.started) * 1000
        self.usage.completion_tokens = self.n_out
        return FinalEvent("".join(self.parts), self.finish, self.usage, t, tail, "".join(self.reasoning_parts), reasoning_tail)


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens two sequences share (the KV cells a prompt can reuse)."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
