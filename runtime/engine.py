"""The engine: load a model, build prompts, and stream a request as typed events.

One long-lived sequence (seq 0 of the sequence core, runtime/sequence.py) keeps the tokens
its KV cells hold, so a request whose prompt starts with them evaluates only what follows
the common prefix. The scheduler drives the same core for N sequences (docs/DESIGN.md).
"""

from __future__ import annotations

import functools
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator
from typing import Sequence as Seq

from tallow.models.convert.bert_import import POOLING
from tallow.runtime.adapters import Adapters
from tallow.runtime.calibration.watch import DepthWatch
from tallow.runtime.drafting.recall import Recall
from tallow.runtime.drafting.speculative import LookupDrafter
from tallow.runtime.errors import ContextOverflow, DraftError
from tallow.runtime.host.threads import Governor, Registry, physical_cores, thread_rule
from tallow.runtime.loadplan import (
    check_draft_fit,
    check_draft_room,
    check_kv_types,
    choose_flash_attn,
    context_notes,
    default_context,
    depth_prediction,
    extra_buffers,
    gpu_layer_count,
    plan_memory,
    read_shape,
)
from tallow.runtime.logprobs import token_logprob
from tallow.runtime.media.spans import cuts, media_prompt, text_only
from tallow.runtime.media.video import fit_frames
from tallow.runtime.protocol import Events
from tallow.runtime.sampling import make_sampler
from tallow.runtime.sequence import DiskPrefixes, OutputStream, Sequence, begin_request, common_prefix, settle_draft
from tallow.runtime.template import continued, framed
from tallow.runtime.text import opens_reasoning, reasoning_markers
from tallow.runtime.types import LoadSettings, ProgressEvent, Request, Timings, TokenEvent

_SEQ = 0


class Engine:
    def __init__(self, path: Path | list[Path], settings: LoadSettings) -> None:
        """Load a model file (or the shards of one, in order)."""
        from tallow.runtime import backend

        started = time.perf_counter()
        backend.init(echo_logs=settings.echo_logs)
        paths = [Path(p) for p in path] if isinstance(path, list) else [Path(path)]
        self.path, self.paths = paths[0], paths
        offload = backend.supports_gpu_offload()
        self.fit_note = self.estimate = None
        shape = read_shape(paths) if settings.check_memory or settings.flash_attn == "auto" else None
        check_kv_types(paths, settings, shape)
        self.flash_attn = choose_flash_attn(settings, shape, offload)
        self.watch, self.machine = DepthWatch(depth_prediction(settings, shape, self.flash_attn)), settings.machine
        # The encoder's attention runs flash unless told off: it never materialises the scores
        # of every patch pair, which for a large picture are gigabytes (docs/DESIGN.md, "Media").
        encoder_flash = settings.flash_attn != "off"
        self.extra_buffers = extra_buffers(settings)
        settings = replace(settings, flash_attn=self.flash_attn)
        if settings.check_memory:  # before anything is allocated
            from tallow.runtime.host.devices import gpu_free_memory

            vram = settings.vram if settings.vram is not None else (gpu_free_memory() if offload else None)
            plan = plan_memory(paths, settings, offload, vram, shape)
            if plan.problem is not None:
                raise plan.problem
            if settings.draft:
                check_draft_fit(list(settings.draft), settings, plan, offload, vram)
            n_ctx, layers, self.estimate, self.fit_note = plan.n_ctx, plan.gpu_layers, plan.estimate, plan.note
        else:
            n_ctx, layers = None, gpu_layer_count(settings.gpu_layers, offload)
        # made before the load, which is the first window it measures the machine's load over
        self.governor = Governor(physical_cores(), settings.n_threads, Registry(settings.registry) if settings.registry
                                 else None, related=settings.related_pids)
        self.gpu_layers = layers  # -1: all of them
        try:
            self.model = backend.Model(paths, layers, extra_buffers=self.extra_buffers, placement=settings.placement)
        except BaseException:
            self.governor.close()
            raise
        # the layers that run on a GPU: none on a build that cannot offload, whatever was asked
        self.offloaded_layers = 0 if not offload else self.model.n_layer if layers < 0 else min(layers, self.model.n_layer)
        pinned, self.thread_rule = thread_rule(settings.n_threads, settings.adapt_threads,
                                               offload and self.offloaded_layers >= self.model.n_layer)
        self.governor.pin(pinned)
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
                                      kv_unified=settings.kv_unified, embeddings=settings.embeddings,
                                      pooling=POOLING[settings.pooling] if settings.pooling else None),
            )
        except BaseException:
            self.governor.close()
            self.model.close()
            raise
        self.n_ctx, self.n_seq_max = self.ctx.n_ctx, settings.n_seq_max  # cells in all; sequences at once
        self.n_batch = self.ctx.n_batch
        # what the user should hear about this load: a context shrunk to fit, rounded, too long
        self.notes = [self.fit_note] if self.fit_note else []
        self.notes += context_notes(settings.n_ctx, self.n_ctx, settings.n_seq_max, self.model.n_ctx_train,
                                    self.model.meta)
        self.drafts = None
        try:
            self.adapters = Adapters(self.model, self.ctx, settings.loras, paths)  # LoRA, by id
            self.projector = self._projector(settings.mmproj, n_threads, encoder_flash)
            self.drafts = self._draft_model(settings, paths, n_threads, layers)
        except BaseException:
            self.close()
            raise
        self.sequence = Sequence(self.ctx, _SEQ)  # a scheduler makes its own, one per slot
        self.recall = Recall(settings.recall)  # what earlier requests read and wrote, for lookup drafts
        self._template = None
        self._settings = settings
        self.disk: DiskPrefixes | None = None  # the disk prompt cache, once attached
        self._prefix_tokens = functools.lru_cache(maxsize=64)(self._tokenized_prefix)
        self.digest: str | None = None  # the model file's sha256, when the store knows it
        self.load_ms = (time.perf_counter() - started) * 1000

    def _draft_model(self, settings: LoadSettings, paths: list[Path], n_threads: int, layers: int):
        """The draft model, in a context shaped as the target's (runtime/drafting/draft_model.py)."""
        if not settings.draft:
            return None
        if settings.embeddings:
            raise DraftError("a draft model drafts answers, and an embedding model writes none",
                             "serve the draft with a model that generates text")
        if not self.ctx.rewinds:
            raise DraftError(f"{self.path.name} has recurrent layers, whose state cannot drop a rejected guess",
                             "run it without a draft model")
        from tallow.runtime.backend import ContextParams
        from tallow.runtime.drafting.draft_model import load_draft

        p = ContextParams(n_ctx=self.n_ctx, n_batch=self.n_batch, n_ubatch=self.n_batch, n_threads=n_threads,
                          flash_attn=settings.flash_attn, n_seq_max=settings.n_seq_max, kv_unified=settings.kv_unified)
        return load_draft(list(settings.draft), self.model, paths, p, settings.draft_limits, layers, settings.draft_name,
                          self.extra_buffers)

    def attach_draft(self, paths: list[Path], name: str, limits) -> None:
        """Load a draft model now (a request named one): checked as at load, its fit against
        the memory that the loaded model leaves. The engine thread sees it from its next step."""
        if self.drafts is not None:
            raise DraftError(f"this model already drafts with {self.drafts.name}")
        settings = replace(self._settings, draft=tuple(paths), draft_name=name, draft_limits=limits)
        if settings.check_memory:
            check_draft_room(list(paths), settings, self.n_ctx, self.offloaded_layers > 0)
        self.drafts = self._draft_model(settings, self.paths, self.n_threads, self.gpu_layers)

    def _projector(self, path: Path | None, n_threads: int, flash: bool):
        if path is None:
            return None
        from tallow.runtime.backend.media import Projector
        from tallow.runtime.media import MARKER

        return Projector(self.model, path, n_threads, MARKER, flash=flash)

    # -- prompts ---------------------------------------------------------------------------
    def chat_template(self):
        if self._template is None:
            from tallow.runtime.template import ChatTemplate

            src = self._settings.persona.template or self.model.chat_template()
            if src is None:
                return None
            piece = lambda t: self.model.piece(t).decode("utf-8", "replace") if t >= 0 else ""  # noqa: E731
            self._template = ChatTemplate(src, piece(self.model.bos), piece(self.model.eos))
        return self._template

    def prompt_for(self, messages: list[dict[str, Any]], raw: bool = False, tools: list | None = None) -> list[int]:
        """Tokens for a conversation: through the model's chat template, or plain text when raw
        (or when the model has none). `tools` go to the template as Hugging Face passes them."""
        return self._prompt(messages, raw, tools)[0]

    def _prompt(self, messages: list[dict[str, Any]], raw: bool, tools: list | None,
                variables: dict[str, Any] | None = None, generation: str = "new"):
        """The prompt's tokens, its media spans (runtime/media/spans.py) and notes on what was
        cut to fit (a video's frames). A message's images are in its "media" list, each at a
        media marker in its content. `variables`: more
        names for the template (a request's chat_template_kwargs, enable_thinking).
        `generation`: "new" (a new assistant turn), "continue" (the last message, an
        assistant's, goes on: a prefill) or "none" (the conversation as it is)."""
        template = None if raw else self.chat_template()
        media = [m for msg in messages for m in msg.get("media") or ()]
        if template is None:
            text = "\n\n".join(m["content"] for m in messages)
            if not media:
                return self.model.tokenize(text, add_special=True, parse_special=False), (), ()
        elif generation == "continue":
            text = continued(template, messages, tools, variables)
        else:
            text = template.render(messages, add_generation_prompt=generation == "new", tools=tools, variables=variables)
        if media:
            tokens, spans = media_prompt(self.projector, self.model, self.path.name, text, media)
            fitted = fit_frames(messages, spans, self.n_ctx // 2, self._count)  # video frames take at most half
            if fitted is None:
                return tokens, spans, ()
            return *self._prompt(fitted[0], raw, tools, variables, generation)[:2], (fitted[1],)
        self.within_reach(text)
        tokens = self.model.tokenize(text, add_special=False, parse_special=True)
        if self.model.add_bos and (not tokens or tokens[0] != self.model.bos):
            tokens.insert(0, self.model.bos)
        return tokens, (), ()

    def within_reach(self, text: str) -> None:
        """A prompt that cannot fit, refused before it is tokenized (the slow part of a long one)."""
        if (least := self.model.fewest_tokens(text, self.n_ctx)) > (n := self.n_ctx):
            raise ContextOverflow(f"the prompt is at least {least} tokens but the context holds {n}", None, least, n)

    served_at = None  # this machine answers (runtime/protocol.py)

    def load_facts(self) -> dict[str, Any]:
        """What this load decided, for --json: "auto" flash attention is the calibration's choice
        for the context's work on the CPU, and llama.cpp's own where layers run on a GPU."""
        return {"flash_attn": self.flash_attn, "gpu_layers": self.offloaded_layers, "extra_buffers": self.extra_buffers,
                "n_ctx": self.n_ctx, "threads": self.n_threads, "threads_rule": self.thread_rule,
                "type_k": self._settings.type_k, "type_v": self._settings.type_v}

    def logprob_entries(self, tokens: list[TokenEvent]) -> list[dict[str, Any]]:
        """The tokens' log-probabilities as the API gives them (`logprobs.content`)."""
        return [token_logprob(ev, self.model.piece) for ev in tokens]

    def tool_format(self) -> str:
        """The tool-call format family of the model's chat template (runtime/tools/formats.py)."""
        from tallow.runtime.tools.formats import detect_format

        template = self.chat_template()
        return detect_format(template.source if template else None)

    def request(self, messages: list[dict[str, Any]], *, raw: bool = False,
                cache_prefixes: Seq[list[dict[str, Any]]] = (), tools=None, **kw) -> Request:
        """A Request for a conversation, knowing the model's reasoning markers. Each of
        `cache_prefixes` (a shorter conversation: the system prompt alone, a document
        without the question) marks where a prefix worth keeping on disk ends. `tools`
        (a runtime.tools.choice.ToolChoice) are shown to the model and constrain its calls."""
        template = None if raw else self.chat_template()
        markers = reasoning_markers(template.source) if template else None
        if not raw:  # a created model's system prompt and few-shot turns (runtime/template.py)
            persona = self._settings.persona
            messages, cache_prefixes = framed(messages, persona), [framed(p, persona) for p in cache_prefixes]
        kw_messages = messages
        from tallow.runtime.tools.constrain import with_tools

        messages, template_tools, kw = with_tools(messages, tools, template, markers, kw)
        if template_tools is not None or messages is not kw_messages:  # prefixes render as the prompt does
            from tallow.runtime.tools.choice import prepare

            cache_prefixes = [prepare(p, tools, template.source if template else None)[0] for p in cache_prefixes]
        variables = dict(kw.pop("template_kwargs", None) or {})
        if kw.get("reasoning_budget") == 0 and template is not None and "enable_thinking" in template.source:
            variables["enable_thinking"] = False  # Qwen3's and others' switch: no reasoning at all
        tokens, spans, notes = self._prompt(messages, raw, template_tools, variables, kw.pop("generation", "new"))
        inside = False
        if markers:
            tail = self.model.detokenize(tokens[-16:]).decode("utf-8", "replace")
            inside = opens_reasoning(tail, markers)
        # Where a cached prefix ends (only a disk cache saves them) and, for a cache that cannot
        # be cut back, where the last turn begins too: the sequence keeps a checkpoint at each.
        rewinds = self.ctx.rewinds
        ends = [common_prefix(self._render_prefix(prefix, raw, template_tools), tokens)
                for prefix in [*cache_prefixes, *([] if rewinds or len(messages) < 2 else [messages[:-1]])]
                if self.disk is not None or not rewinds]
        return Request(tokens, reasoning_markers=markers, starts_in_reasoning=inside, media=spans, notes=notes,
                       cache_points=tuple(ends[:len(cache_prefixes)] if self.disk is not None else ()),
                       turns=() if rewinds else tuple(ends), **kw)

    def _count(self, text: str) -> int:
        return len(self.model.tokenize(text, add_special=False, parse_special=False))

    def _render_prefix(self, messages: list[dict[str, Any]], raw: bool, tools: list | None = None) -> list[int]:
        template = None if raw else self.chat_template()
        if template is None:
            return self.prompt_for(messages, raw=True)
        return list(self._prefix_tokens(template.render(messages, add_generation_prompt=False, tools=tools)))

    def _tokenized_prefix(self, text: str) -> tuple[int, ...]:
        """A rendered prefix's tokens (kept by `_prefix_tokens`, an LRU of this engine's: the same
        system prompt comes with request after request, and tokenizing it cost as much as the rest)."""
        return tuple(self.model.tokenize(text, add_special=False, parse_special=True))

    # -- the disk cache of prompt prefixes ---------------------------------------------------
    def use_prompt_cache(self, cache, model_sha256: str) -> None:
        """Attach a PromptCache; states are keyed by everything that shapes the KV contents."""
        from tallow.runtime.prompt_cache import fingerprint

        s = self._settings
        self.disk = DiskPrefixes(cache, fingerprint({
            "model": model_sha256, "n_ctx": self.n_ctx, "n_batch": self.n_batch, "type_k": s.type_k, "type_v": s.type_v,
            "flash_attn": self.flash_attn, "rope": "model", "n_seq_max": s.n_seq_max, "llama_cpp": self._backend_version(),
            "extra_buffers": self.extra_buffers, **({"lora": self.adapters.identity()} if s.loras else {}),
            **({"mmproj": self._projector_identity()} if self._settings.mmproj is not None else {}),
        }))

    def _projector_identity(self) -> str:
        """What names the projector that encoded a saved state's media cells (a store blob's
        name is its digest; another file's name, size and modification time stand in)."""
        path = self._settings.mmproj
        assert path is not None  # asked only when there is one
        st = path.stat()
        return f"{path.name}:{st.st_size}:{st.st_mtime_ns}"

    @staticmethod
    def _backend_version() -> str:
        from importlib.metadata import version

        return version("llama-cpp-python")

    def save_prompt(self, request: Request) -> int:
        """Save the request's prompt, and its cache points, to the disk cache (after the answer;
        see DiskPrefixes.save). Returns how many entries were written."""
        return self.disk.save(self.sequence, request) if self.disk is not None else 0

    @property
    def kv(self) -> list[int]:
        """The tokens whose KV cells seq 0 holds, in position order."""
        return self.sequence.kv

    def tokenize(self, text: str, special: bool = False) -> list[int]:
        return self.model.tokenize(text, add_special=special, parse_special=special)

    # -- generation --------------------------------------------------------------------------
    def stream(self, request: Request) -> Events:
        """Yield a TokenEvent per sampled token (ProgressEvents first, if asked), then one FinalEvent.

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
        run = OutputStream(request, self.model, Timings(load_ms=self.load_ms))
        try:
            yield from self._generate(run, prompt)
        except KeyboardInterrupt:
            run.finish = "interrupted"
        yield run.final()

    def _prefill(self, run: OutputStream, prompt: list[int], sampler) -> Iterator[ProgressEvent]:
        seq, key = self.sequence, self.adapters.claim(self.sequence, run.request.lora)
        self.adapters.apply(key)
        disk = self.disk if self.adapters.disk_ok(key) else None
        cached, stops = begin_request(seq, run, disk, sampler)
        todo = prompt[cached:]
        # A prompt that will be saved to disk gets its last token evaluated alone, as a later
        # run that loads the saved state must: llama.cpp's logits differ in the last bits
        # between batch sizes, and at temperature 0 that could change the answer.
        split = disk is not None and disk.saves_prompt(run.request)
        body = todo[: len(todo) - split] if todo else todo
        spans = {s.start: s for s in run.request.media}
        ends = cuts({*range(cached + self.n_batch, cached + len(body), self.n_batch), *stops.all(), cached + len(body)},
                    run.request.media, cached, cached + len(body))
        chunks = [prompt[a:b] for a, b in zip([cached, *ends], ends) if b > a]
        if split and todo:
            chunks.append(todo[-1:])
        # Chunks of n_batch keep Ctrl-C responsive during a long prefill and bound memory; a
        # chunk also ends at each cache point not on disk yet, which is saved right there (and
        # at each checkpoint a recurrent state keeps: Stops).
        # A media chunk is evaluated through the projector, as one chunk of its own.
        for n, chunk in enumerate(chunks):
            span = spans.get(len(seq.kv))
            if span is not None:
                seq.placed(chunk, self._evaluate_media(run, span))
            else:
                self.ctx.decode(chunk, seq.next_pos, _SEQ, want_last_logits=n == len(chunks) - 1)
                seq.kv.extend(chunk)
            if run.request.progress:
                yield run.progress(len(seq.kv))
            stops.reached()

    def _evaluate_media(self, run: OutputStream, span) -> int:
        """Encode a media chunk and evaluate it into the sequence; returns the next position."""
        assert self.projector is not None  # a prompt has spans only through the projector
        started = time.perf_counter()
        embd = self.projector.encode(span.chunk, self.model.n_embd)
        run.timings.media_ms += (time.perf_counter() - started) * 1000
        return self.projector.decode(self.ctx, span.chunk, embd, self.sequence.next_pos, _SEQ)

    def sampler_for(self, request: Request, forced=None, kept: dict | None = None):
        """The request's sampler (runtime/sampling.py; the caller closes it)."""
        return make_sampler(self.model, request, forced, kept)

    def _generate(self, run: OutputStream, prompt: list[int]) -> Iterator[TokenEvent | ProgressEvent]:
        sampler = self.sampler_for(run.request, run.forced_token, run.kept)
        try:
            yield from self._prefill(run, prompt, sampler)
            run.decoding()
            yield from self._decode_loop(run, sampler)
        finally:
            sampler.close()

    def _decode_loop(self, run: OutputStream, sampler) -> Iterator[TokenEvent]:
        """Sample, take, decode, one token a step; with lookup drafts, a step decodes the
        sampled token and a guess of what follows, and takes every confirmed guess."""
        ctx, seq = self.ctx, self.sequence
        kv = seq.kv
        drafter = self.drafter_for(run, _SEQ)
        sample = sampler.sample
        sampled = [(-1, sample(ctx, -1))]  # (logit row, token); all but the last are in the KV cache
        guesses = 0  # how many of them are confirmed draft tokens
        while True:
            events, ended = run.take_all(ctx, sampled, guesses)
            yield from events
            if ended is not None:  # like plain decoding, the last token taken stays out of the cache
                seq.keep(len(kv) - (len(sampled) - ended))
                return
            token = sampled[-1][1]
            if len(kv) >= self.n_ctx:
                run.finish = "length"  # the context is full
                return
            self.pace()
            base = len(kv)
            if drafter is None:
                began = time.perf_counter() if self.watch.predicted else 0.0  # timed only when checked
                ctx.decode([token], seq.next_pos, _SEQ)
                if began:
                    self.watch.seen(base, time.perf_counter() - began)
                kv.append(token)
                sampled, guesses = [(-1, sample(ctx, -1))], 0
                continue
            drafter.extend(t for _, t in sampled)
            step_began = time.perf_counter()
            draft = drafter.propose(min(self.n_ctx - base - 1, self.n_batch - 1))
            began = time.perf_counter()
            ctx.decode([token, *draft], seq.next_pos, _SEQ, all_logits=True)
            call_ms = (time.perf_counter() - began) * 1000
            drafter.observe_step(1, 1 + len(draft), call_ms)
            kv.append(token)
            kv.extend(draft)
            accepted, after = settle_draft(seq, run, drafter, draft, lambda i: sample(ctx, i))
            drafter.observe_whole(1, call_ms, (time.perf_counter() - step_began) * 1000)
            sampled, guesses = [*enumerate(accepted), (len(accepted), after)], len(accepted)

    def drafter_for(self, run: OutputStream, seq_id: int):
        """The request's drafter, for the engine's and the scheduler's decode loops alike;
        its usage names what drafts."""
        request = run.request
        if not self.ctx.rewinds:  # a recurrent state cannot drop rejected guesses: plain decoding
            return None
        if request.draft == "lookup":  # a prediction is the only source it drafts from
            run.usage.draft = "prediction" if request.prediction else "lookup"
            memory = None if request.prediction else self.recall.memory(request.tenant)
            return LookupDrafter(text_only(request.prompt_tokens), request.prediction, memory, run.usage)
        if request.draft == "model" and self.drafts is not None:
            run.usage.draft = self.drafts.name
            return self.drafts.drafter(seq_id, text_only(request.prompt_tokens), request.tenant)
        return None

    def reset(self) -> None:
        """Forget every cached token (the next prompt is evaluated in full)."""
        self.ctx.clear()
        self.sequence.clear()

    @property
    def n_threads(self) -> int:
        """The threads decoding now (runtime/host/threads.py may change them between steps)."""
        return self.ctx.n_threads

    def pace(self) -> None:
        """Once per decode step, by every decode loop: follow the cores free (runtime/host/threads.py)."""
        self.governor.pace(self.ctx)

    def close(self) -> None:
        if getattr(self, "watch", None) is not None:
            self.watch.report(self.machine, self.governor.threads)
        if getattr(self, "projector", None) is not None:
            self.projector.close()
            self.projector = None
        drafts, self.drafts = getattr(self, "drafts", None), None
        if drafts is not None:
            drafts.close()
        self.governor.close()
        self.ctx.close()
        self.model.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
