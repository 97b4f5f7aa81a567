"""The request fields, declared once: what each is, its range and default, and its name on
every surface that has it (or why a surface has none).

Every surface derives from this table: the HTTP parsers (wire/), run's and chat's flags
(cli/options.py), Modelfile PARAMETERs and stored presets (models/preset.py), chat's `/set`
(runtime/chat.py), `tallow.api`'s keywords, and `tallow show --parameters`. A value is
checked here, once, so a range and its error text are the same on all of them. Adding a
sampler field is one row here and the engine's use of it (docs/DESIGN.md, "Request fields").

Pure data and checks: this module imports nothing of tallow, so every layer may use it.
"""

from __future__ import annotations

import math
from typing import Any

# The surfaces, and what a name on each is. Batch records are OpenAI bodies (jobs/records.py),
# so the batch surface is "openai".
SURFACES: dict[str, str] = {
    "openai": "OpenAI's chat and completions bodies (and batch records)",
    "responses": "OpenAI's Responses bodies",
    "anthropic": "Anthropic's Messages bodies",
    "ollama": "Ollama's `options`",
    "llamacpp": "llama.cpp's native /completion bodies",
    "modelfile": "Modelfile PARAMETERs and stored presets",
    "cli": "run's and chat's flags",
    "set": "chat's /set",
    "api": "tallow.api's keywords",
}


class FieldError(ValueError):
    """A value a field does not take; `message` names the field as the surface spells it."""

    def __init__(self, message: str, name: str) -> None:
        super().__init__(message)
        self.message, self.name = message, name


class Field:
    """One request field. `names`: its names per surface (the first is the one shown, the
    rest are accepted aliases); `absent`: the surfaces that do not have it, and why. A plain
    class with slots (every command and every request reads the table; a dataclass's
    generated methods would cost each command's start-up for nothing)."""

    __slots__ = ("name", "kind", "low", "high", "default", "help", "names", "absent", "many", "sampling", "unset",
                 "shape", "off")

    def __init__(self, name: str, kind: type, low: float | None, high: float | None, default: Any, help: str,
                 names: dict[str, tuple[str, ...]], absent: dict[str, str], many: bool = False,
                 sampling: bool = True, unset: dict[str, tuple[int, ...]] | None = None, shape: str = "",
                 off: dict[str, tuple[str, ...]] | None = None) -> None:
        self.name = name  # the internal name: runtime.types.Sampling's field, or the request's
        self.kind = kind  # float, int or str; object for a shaped field (below)
        # A shaped field (`shape` says what its value is: a schema, tools, a map of biases) is
        # carried by one or more body fields per surface, each surface in its own form; its
        # `names` are those body fields, together, and the surface's parser checks the shape.
        self.shape = shape
        self.low, self.high, self.default, self.help = low, high, default, help
        self.names, self.absent = names, absent
        self.many = many  # repeatable: the values form a list (stop)
        self.sampling = sampling  # a field of runtime.types.Sampling
        self.unset = unset or {}  # a body field's name -> its values that mean "not set"
        self.off = off or {}  # a text surface (/set) -> the words that clear the value given before

    def __repr__(self) -> str:
        return f"Field({self.name!r})"

    def on(self, surface: str) -> str | None:
        """Its name on `surface`, or None where it is not there."""
        found = self.names.get(surface)
        return found[0] if found else None

    def check(self, value: Any, label: str | None = None, text: bool = False) -> Any:
        """`value` as this field's kind, in range; FieldError (naming it as `label`) otherwise.
        `text`: a value typed as text (a flag, a PARAMETER line, /set), converted; else a JSON
        value, which must already be of the kind (an integer field takes no 2.0). Every request
        passes here: the common case (a number of the right kind, in range) builds no text."""
        if self.many and isinstance(value, (list, tuple)):
            return [self.check(v, label, text)[0] for v in value]
        kind = type(value)
        if kind is self.kind:
            got = value if kind is not float or math.isfinite(value) else None
        elif kind is int and self.kind is float:
            if abs(value) > 2 ** 1023:  # past any float: float() would raise OverflowError
                raise FieldError(f"{label or self.name} must be a number {self.span()}".rstrip(), label or self.name)
            got = float(value)
        else:
            got = None
        if got is None:
            got = self.convert(value, label or self.name, text)
        if self.low is not None and not self.low <= got <= self.high:
            label = label or self.name
            shown = repr(value)
            raise FieldError(f"{label} must be between {self.span(' and ')}, not "
                             f"{shown if len(shown) <= 40 else shown[:20] + f'... ({len(shown)} digits)'}", label)
        if self.kind is str and not got:
            raise FieldError(f"{label or self.name} {'wants a non-empty text' if text else 'must be a non-empty string'}",
                             label or self.name)
        return [got] if self.many else got

    def span(self, between: str = " to ") -> str:
        """Its range as text ("0 to 2"; "" for none): the one way every surface shows it."""
        if self.low is None or self.high is None:
            return ""
        shown = (lambda v: str(int(v))) if self.kind is int else (lambda v: f"{v:g}")  # noqa: E731
        return f"{shown(self.low)}{between}{shown(self.high)}"

    def convert(self, value: Any, label: str, text: bool) -> Any:
        """The slow path of `check`: text converted, anything else of the wrong kind refused."""
        if isinstance(value, str) and text and self.kind is not str:
            try:
                got = int(value.strip(), 10) if self.kind is int else float(value)
                if self.kind is int or math.isfinite(got):
                    return got
            except ValueError:
                pass
        if text:
            want = {str: "a non-empty text", int: "a whole number", float: "a number"}[self.kind]
            raise FieldError(f"{label} wants {want}, not {value!r}", label)
        want = {str: "a non-empty string", int: "an integer", float: "a number"}[self.kind]
        raise FieldError(f"{label} must be {want}", label)


ALL = tuple(SURFACES)


def _row(name: str, kind: type, low: float | None, high: float | None, default: Any, help: str,
         *, rename: dict[str, tuple[str, ...] | str] | None = None, absent: dict[str, str] | None = None,
         many: bool = False, sampling: bool = True, unset: dict[str, tuple[int, ...]] | None = None,
         off: dict[str, tuple[str, ...]] | None = None) -> Field:
    """A field named `name` on every surface (`--name-with-dashes` as a flag), except where
    `rename` names it otherwise and `absent` says why it is not there."""
    absent = absent or {}
    names: dict[str, tuple[str, ...]] = {}
    for surface in ALL:
        if surface in absent:
            continue
        given = (rename or {}).get(surface)
        if given is None:
            given = "--" + name.replace("_", "-") if surface == "cli" else name
        names[surface] = (given,) if isinstance(given, str) else tuple(given)
    return Field(name, kind, low, high, default, help, names, absent, many, sampling, unset or {}, off=off)


NO_STOP_SET = "chat's /set takes one value a setting; give stop strings with --stop when the chat starts"

FIELDS: tuple[Field, ...] = (
    _row("temperature", float, 0, 2, 0.8, "Sampling temperature; 0 is greedy and deterministic."),
    _row("top_k", int, 0, 1_000_000, 40, "Keep the K most likely tokens (0: all)."),
    _row("top_p", float, 0, 1, 0.95, "Nucleus sampling: keep tokens up to this cumulative probability (1: off)."),
    _row("min_p", float, 0, 1, 0.05, "Drop tokens less likely than this fraction of the most likely one (0: off)."),
    _row("typical_p", float, 0, 1, 1.0, "Locally typical sampling: keep the tokens whose surprise is nearest the "
         "entropy, up to this probability (1: off)."),
    _row("mirostat", int, 0, 2, 0, "Mirostat 1 or 2 in place of top-k, top-p and min-p: sample at a target "
         "surprise (0: off)."),
    _row("mirostat_tau", float, 0, 100, 5.0, "Mirostat's target surprise (lower: more focused)."),
    _row("mirostat_eta", float, 0, 1, 0.1, "Mirostat's learning rate."),
    _row("repeat_penalty", float, 0.01, 10, 1.0, "Penalty for tokens among the last repeat_last_n (1: off).",
         rename={"openai": ("repeat_penalty", "repetition_penalty")}),
    _row("repeat_last_n", int, 0, 1_000_000, 64, "How many of the last tokens the penalties look at."),
    _row("frequency_penalty", float, -2, 2, 0.0, "Minus this for each earlier use of a token (in the last "
         "repeat_last_n)."),
    _row("presence_penalty", float, -2, 2, 0.0, "Minus this once for a token already used (in the last "
         "repeat_last_n)."),
    _row("seed", int, -(2**63), 2**64 - 1, None, "Random seed; the same seed and prompt give the same answer "
         "(reduced to llama.cpp's 32 bits) [default: random].", unset={"seed": (-1,)}),
    _row("max_tokens", int, 1, 2**31, None, "Stop after this many tokens [default: until the context is full, or "
         "the server's limit].", sampling=False,
         rename={"openai": ("max_tokens", "max_completion_tokens", "n_predict"), "responses": "max_output_tokens",
                 "ollama": "num_predict", "llamacpp": "n_predict", "modelfile": "num_predict",
                 "cli": ("--max-tokens", "-n")},
         # llama.cpp's and Ollama's "no limit of the request's own" (Ollama's -2: fill the context)
         unset={"n_predict": (-1,), "num_predict": (-1, -2)}, off={"set": ("off", "0", "-1")}),
    _row("stop", str, None, None, (), "Stop where this text appears (repeatable); it is not part of the answer.",
         sampling=False, many=True, rename={"anthropic": "stop_sequences"}, absent={"set": NO_STOP_SET}),
)



def _shaped(name: str, shape: str, help: str, names: dict[str, tuple[str, ...] | str], absent: dict[str, str]) -> Field:
    """A shaped field: its body fields on each surface that has it, and why the others do not."""
    named = {s: (n,) if isinstance(n, str) else n for s, n in names.items()}
    return Field(name, object, None, None, None, help, named, absent, sampling=False, shape=shape)


# OpenAI's reasoning efforts as budgets (tokens of reasoning), and Ollama's think as the CLI and
# /set take it: on (no cap), off (no reasoning at all) or an effort
EFFORT_BUDGETS = {"none": 0, "minimal": 128, "low": 512, "medium": 2048, "high": 8192}
THINK_WORDS = ("on", "off", "true", "false", "low", "medium", "high")


def think_budget(word: str, label: str = "think") -> int | None:
    """A --think or /set think word as a reasoning budget: None (no cap), 0, or an effort's."""
    word = word.strip().lower()
    if word not in THINK_WORDS:
        raise FieldError(f"{label} is one of {', '.join(THINK_WORDS)}, not {word!r}", label)
    return None if word in ("on", "true") else 0 if word in ("off", "false") else EFFORT_BUDGETS[word]


PRESET = "a preset holds a model's defaults for sampling and limits; this is each request's own"
AT_START = "chat sets this once, with its flag, when it starts"
FROM_FORMAT = {"responses": "a schema goes in text.format", "ollama": "a schema goes in format",
               "api": "format takes a schema, as Ollama's does"}
NO_MESSAGES_SHAPE = ("the Messages API has no such field; a tool's input_schema with tool_choice shapes an answer, "
                     "and tallow takes those")
NATIVE_TEXT = "the native body is a plain-text prompt, with no chat template around it"

SHAPED: tuple[Field, ...] = (
    _shaped("format", "text, json_object or a JSON schema", "The answer's shape: free text, one JSON object, or JSON "
            "that follows a schema (grammar-constrained).",
            {"openai": "response_format", "responses": "text", "ollama": "format", "cli": "--format", "api": "format"},
            {"anthropic": NO_MESSAGES_SHAPE, "llamacpp": "the native body gives a shape as json_schema or grammar",
             "modelfile": PRESET, "set": AT_START}),
    _shaped("json_schema", "a JSON schema", "The answer is JSON that follows this schema (llama.cpp's extension on "
            "OpenAI's bodies).",
            {"openai": "json_schema", "llamacpp": "json_schema", "cli": "--json-schema"},
            {**FROM_FORMAT, "anthropic": NO_MESSAGES_SHAPE, "modelfile": PRESET, "set": AT_START}),
    _shaped("grammar", "GBNF text", "The answer follows this GBNF grammar (llama.cpp's).",
            {"openai": "grammar", "llamacpp": "grammar", "cli": "--grammar", "api": "grammar"},
            {"responses": "not in the Responses API; text.format takes a schema",
             "anthropic": NO_MESSAGES_SHAPE, "ollama": "not in Ollama's API; format takes a schema",
             "modelfile": PRESET, "set": AT_START}),
    _shaped("logit_bias", "token id (or, natively, text) -> bias from -100 to 100",
            "Add a bias to tokens' logits; -100 bans a token.",
            {"openai": "logit_bias", "responses": "logit_bias", "llamacpp": "logit_bias"},
            {"anthropic": "the Messages API has no logit bias", "ollama": "Ollama has no logit-bias option",
             "modelfile": PRESET, "cli": "token ids are the model's own: the APIs take them, a flag does not yet",
             "set": "token ids are the model's own: the APIs take them, /set does not yet",
             "api": "token ids are the model's own: the HTTP APIs take them, tallow.api does not yet"}),
    _shaped("logprobs", "how many likeliest alternatives (0 to 20)", "Report each token's log-probability and its "
            "N likeliest alternatives.",
            {"openai": ("logprobs", "top_logprobs"), "ollama": ("logprobs", "top_logprobs"), "llamacpp": ("n_probs", "post_sampling_probs"),
             "cli": "--logprobs", "set": "logprobs", "api": "logprobs"},
            {"responses": "Responses gives them with include: message.output_text.logprobs, which tallow does not "
             "make yet", "anthropic": "the Messages API has no log-probabilities", "modelfile": PRESET}),
    _shaped("tools", "function tools, and which one the model must call", "Offer the model functions to call, and "
            "constrain its calls to their schemas.",
            {"openai": ("tools", "tool_choice", "parallel_tool_calls"),
             "responses": ("tools", "tool_choice", "parallel_tool_calls"), "anthropic": ("tools", "tool_choice"),
             "ollama": "tools", "cli": ("--tools", "--tool-choice")},
            {"llamacpp": NATIVE_TEXT + "; tools go through /v1/chat/completions", "modelfile": PRESET,
             "set": "a chat shows the answer as text; tool calls need a client that runs them (tallow run --tools)",
             "api": "tallow.api answers with text; a client that runs tools talks to tallow serve"}),
    _shaped("reasoning", "a budget in tokens (-1: none), or an effort", "How long a reasoning model may think "
            "(tokens, its closing marker included); an effort stands for a budget.",
            {"openai": ("reasoning_budget", "reasoning_effort"), "responses": ("reasoning_budget", "reasoning"),
             "anthropic": "thinking", "ollama": "think", "cli": ("--reasoning-budget", "--think"), "set": "think",
             "api": "reasoning_budget"},
            {"llamacpp": NATIVE_TEXT, "modelfile": PRESET}),
    _shaped("draft", "\"lookup\" or the draft model's name", "Speculative decoding: draft from the prompt and "
            "answer so far, or with the draft model loaded beside this one.",
            {"openai": "draft", "responses": "draft", "anthropic": "draft", "llamacpp": "draft", "cli": "--draft",
             "set": "draft"},
            {"ollama": "Ollama's bodies have no place for it; tallow serve --draft drafts for every request",
             "modelfile": PRESET, "api": "tallow.api loads no draft model"}),
    _shaped("lora", "each loaded adapter's scale, by id", "The scale of each LoRA adapter loaded with the model "
            "(an adapter not named is off).",
            {"openai": "lora", "llamacpp": "lora", "cli": "--lora"},
            {"responses": "not in the Responses API; use the OpenAI or native bodies",
             "anthropic": "not in the Messages API; use the OpenAI or native bodies",
             "ollama": "not in Ollama's API; use the OpenAI or native bodies",
             "modelfile": "ADAPTER lines load adapters with the model, at scale 1",
             "set": "adapters are loaded when the chat starts (--lora FILE:SCALE)",
             "api": "tallow.api loads a created model's ADAPTER lines, at their scale"}),
    _shaped("cache", "true or false", "Reuse the longest cached prefix of the prompt (false: evaluate it all); "
            "save_prompt keeps the whole prompt in the disk cache.",
            {"openai": ("cache_prompt", "save_prompt"), "llamacpp": "cache_prompt", "cli": "--no-cache",
             "api": "prompt_cache"},
            {"responses": "every Responses request reuses the longest cached prefix",
             "anthropic": "every Messages request reuses the longest cached prefix (cache_control is not needed)",
             "ollama": "every Ollama request reuses the longest cached prefix", "modelfile": PRESET,
             "set": "a chat keeps its own cache, from turn to turn"}),
    _shaped("media", "images, audio and video among the prompt's parts",
            "Images, audio and video (as its frames) for a model with a projector.",
            {"openai": ("image_url", "input_audio", "video_url"), "responses": ("input_image", "input_video"),
             "anthropic": "image", "ollama": "images", "llamacpp": "multimodal_data",
             "cli": ("--image", "--audio", "--video"), "set": ("/image", "/audio", "/video")},
            {"modelfile": "a Modelfile gives the projector (FROM a vision model), not what it is shown",
             "api": "tallow.api takes text and messages of text; serve the model for images and audio"}),
)

# The names of a shaped field that are carried inside a message's content (a part's type) or the
# prompt object (llama.cpp's multimodal_data), or are chat commands: not a body's top-level fields
IN_CONTENT = {"image_url", "input_audio", "input_image", "image", "multimodal_data", "video_url", "input_video", "/image",
              "/audio", "/video"}

BY_NAME: dict[str, Field] = {f.name: f for f in (*FIELDS, *SHAPED)}
SAMPLING = tuple(f for f in FIELDS if f.sampling)


def default(name: str) -> Any:
    return BY_NAME[name].default


def on_surface(surface: str, shaped: bool = False) -> dict[str, Field]:
    """Every name `surface` gives a field (aliases included) -> the field: the valued fields
    (FIELDS), and with `shaped` the shaped ones too."""
    return {n: f for f in (*FIELDS, *(SHAPED if shaped else ())) for n in f.names.get(surface, ())}
