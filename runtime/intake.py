"""A checked request, as every API's parser builds it (`Parsed`), and the one place it becomes
the engine's Request (`to_request`): rendered through the chat template, tokenized, its
draft method looked up on the loaded engine, llama.cpp's mixed prompts, fill-in-the-middle
prompts and text-keyed logit biases tokenized. The parsers (wire/) only translate bodies;
what needs the model is done here, once, for the runner (serve/) and batch files (jobs/)
alike. A refusal is an APIError naming the field, which each API shapes as its own."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tallow.common.errors import APIError, TallowError
from tallow.runtime.grammar import Schema
from tallow.runtime.tools.choice import ToolChoice
from tallow.runtime.types import Request, Sampling


@dataclass
class Parsed:
    """A checked request: what the engine needs, plus how to shape the answer."""

    messages: list[dict[str, Any]] | None  # chat
    prompt: str | list[Any] | None  # text completion: text, or token ids (llama.cpp's /completion: or both mixed)
    max_tokens: int
    stop: tuple[str, ...]
    sampling: Sampling
    stream: bool
    include_usage: bool
    logprobs: int | None
    json_format: bool
    schema: Schema | None
    ignore_eos: bool = False  # llama.cpp's extension: never end early (benchmarks)
    draft: str | None = None  # tallow's extension: "lookup" drafts (speculative decoding)
    save_prompt: bool = False  # tallow's extension: keep the whole prompt in the disk prompt cache
    reuse_cache: bool = True  # llama.cpp's cache_prompt: false evaluates the whole prompt anew
    tools: ToolChoice | None = None
    grammar: str | None = None  # llama.cpp's extension: GBNF constraining the answer
    logit_bias: tuple[tuple[int, float], ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)  # what one API keeps for shaping its answer
    n: int = 1  # OpenAI's n: answers from one prompt (the runner forks the sequence after prefill)
    lora: tuple[float, ...] | None = None  # llama-server's `lora`: each adapter's scale by id (None: the defaults)
    reasoning_budget: int | None = None  # tokens the reasoning may take (runtime/sequence.py); None: no cap
    prediction: str | None = None  # OpenAI's Predicted Outputs: the text the answer is expected to be close to
    generation: str = "new"  # "continue": the last (assistant) message is a prefill; "none": no generation prompt
    template_kwargs: dict[str, Any] | None = None  # chat_template_kwargs: more names the chat template reads
    post_probs: bool = False  # llama.cpp's post_sampling_probs: probabilities after the sampler chain
    progress: bool = False  # llama.cpp's return_progress: a report after each chunk of the prompt

    def request_kwargs(self) -> dict[str, Any]:
        return {"max_tokens": self.max_tokens, "stop": self.stop, "sampling": self.sampling, "logprobs": self.logprobs,
                "post_probs": self.post_probs, "progress": self.progress,
                "ignore_eos": self.ignore_eos, "draft": self.draft, "save_prompt": self.save_prompt,
                "reuse_cache": self.reuse_cache,
                "logit_bias": self.logit_bias, "lora": self.lora, "reasoning_budget": self.reasoning_budget,
                **({"generation": self.generation, "template_kwargs": self.template_kwargs}
                   if self.messages is not None else {})}


def to_request(engine, parsed: Parsed) -> Request:
    """The engine request for a checked one: tokens through the chat template (or plain text
    for a completion), and the grammar for its response format. The leading system messages
    are a prefix worth keeping in the disk prompt cache (the prompt that many requests share)."""
    from tallow.runtime.grammar import grammar_for
    from tallow.runtime.media import MediaError

    try:
        grammar = parsed.grammar or grammar_for(parsed.json_format, parsed.schema)
    except TallowError as exc:
        raise APIError(exc.message, param="response_format") from exc
    kwargs = {**parsed.request_kwargs(), "draft": draft_method(engine, parsed.draft)}
    if parsed.prediction:
        kwargs["prediction"] = tuple(engine.model.tokenize(parsed.prediction, add_special=False, parse_special=False))
    if parsed.messages is not None:
        _check_template_kwargs(engine, parsed.template_kwargs)
        head = 0
        while head < len(parsed.messages) - 1 and parsed.messages[head]["role"] == "system":
            head += 1
        prefixes = [parsed.messages[:head]] if head else []
        try:
            return engine.request(parsed.messages, grammar=grammar, cache_prefixes=prefixes, tools=parsed.tools,
                                  raw=bool(parsed.extra.get("raw")), **kwargs)
        except MediaError as exc:  # images for a model without a projector
            raise APIError(exc.message, param="messages") from exc
    assert parsed.prompt is not None  # a completion's
    return Request(tokens_of(engine, parsed.prompt), grammar=grammar, **kwargs)


def _check_template_kwargs(engine, names: dict[str, Any] | None) -> None:
    """chat_template_kwargs the model's template never reads are refused by name, not ignored."""
    template = engine.chat_template() if names else None
    unread = sorted(set(names or ()) - template.reads) if template is not None else sorted(names or ())
    if unread:
        own = sorted(template.reads - {"messages", "tools", "add_generation_prompt", "bos_token", "eos_token",
                                       "raise_exception", "range", "namespace", "strftime_now"}) if template else []
        raise APIError(f"'chat_template_kwargs': this model's chat template never reads {unread[0]!r}"
                       + (f" (it reads {', '.join(own)})" if own else " (it reads none)"), param="chat_template_kwargs")


def draft_method(engine, draft: str | None) -> str | None:
    """A request's `draft` as the engine's method: "lookup", or "model" where it names the
    draft model this engine loaded."""
    if draft in (None, "lookup"):
        return draft
    loaded = engine.drafts.name if engine.drafts is not None else None
    if loaded is None:
        raise APIError(f"'draft': this model was not served with a draft model, so it cannot draft with {draft!r} "
                       "(serve --draft MODEL, or --model-option 'NAME draft=MODEL'); \"lookup\" needs none",
                       param="draft")
    if draft not in (loaded, loaded.removesuffix(":latest")):
        raise APIError(f"'draft': this model drafts with {loaded}, not {draft!r} (a served model holds one draft model)",
                       param="draft")
    return "model"


def tokens_of(engine, prompt: str | list[Any]) -> list[int]:
    """A prompt's tokens: text tokenized with BOS; a list of token ids and text pieces (llama.cpp's
    mixed prompt), the text pieces tokenized (the first with BOS) and the ids as they are."""
    engine.within_reach(prompt if isinstance(prompt, str) else "".join(p for p in prompt if isinstance(p, str)))
    if isinstance(prompt, str):
        return engine.model.tokenize(prompt, add_special=True, parse_special=False)
    out: list[int] = []
    for i, part in enumerate(prompt):
        out += engine.model.tokenize(part, add_special=i == 0, parse_special=False) if isinstance(part, str) else [part]
    vocab = engine.model.n_vocab
    if not all(0 <= t < vocab for t in out):
        raise APIError(f"'prompt' has a token id outside the vocabulary (0 to {vocab - 1})", param="prompt")
    return out


def infill_tokens(engine, prefix: str, suffix: str, prompt: str | list[Any]) -> list[int]:
    """llama.cpp's fill-in-the-middle prompt: prefix token, `prefix`, suffix token, `suffix`,
    middle token, then `prompt` (text the middle already starts with)."""
    fim = engine.model.fim_tokens()
    if fim is None:
        raise APIError("this model has no fill-in-the-middle tokens: /infill needs a code model that has them",
                       param="input_prefix")
    parts = [engine.model.tokenize(v, add_special=False, parse_special=False) if v else [] for v in (prefix, suffix)]
    start = tokens_of(engine, prompt) if prompt else []
    if start and engine.model.add_bos and start[0] == engine.model.bos:  # the BOS goes first, once
        start = start[1:]
    head = [engine.model.bos] if engine.model.add_bos else []
    return [*head, fim[0], *parts[0], fim[1], *parts[1], fim[2], *start]


def text_bias(engine, parsed: Parsed) -> None:
    """The logit_bias entries keyed by text, tokenized: every token of the text gets the bias
    (-100: banned), as llama.cpp's server does."""
    extra = []
    for text, bias in parsed.extra.get("bias_text") or ():
        for token in engine.model.tokenize(text, add_special=False, parse_special=False):
            extra.append((token, float("-inf") if bias <= -100 else bias))
    if extra:
        parsed.logit_bias = (*parsed.logit_bias, *extra)
