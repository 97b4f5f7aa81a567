"""Flags shared by several commands, defined once so `--ctx` means the same everywhere."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from tallow.cli.field_flags import option


def complete_model(incomplete: str) -> list[str]:
    from tallow.cli.completion import model_names

    return model_names(incomplete)


Model = Annotated[str, typer.Argument(help="A stored model name, a known name such as smollm2:135m, or a path to a .gguf file.", show_default=False, autocompletion=complete_model)]
Ctx = Annotated[Optional[int], typer.Option("--ctx", min=16, help="Context size in tokens [default: TALLOW_CONTEXT_LENGTH, capped at the model's trained length].", show_default=False)]
Threads = Annotated[Optional[int], typer.Option("--threads", "-t", min=1, help="CPU threads [default: the physical cores that are free, followed while decoding].", show_default=False)]
GpuLayers = Annotated[str, typer.Option("--gpu-layers", help="Layers to offload to a GPU: auto (all when the build can offload, else 0), all, or N.")]
Device = Annotated[Optional[str], typer.Option("--device", help="GPUs to use, comma-separated, as ggml names them (Vulkan0,CUDA1; tallow doctor lists them) [default: every GPU].", show_default=False)]
MainGpu = Annotated[int, typer.Option("--main-gpu", min=0, help="With --split-mode none: the GPU that holds the whole model (an index into --device).")]
SplitMode = Annotated[str, typer.Option("--split-mode", help="Over several GPUs: none (one GPU), layer (whole layers each) or row.")]
TensorSplit = Annotated[Optional[str], typer.Option("--tensor-split", help="Each GPU's share of the model, comma-separated (e.g. 3,1) [default: by free memory].", show_default=False)]
FlashAttn = Annotated[str, typer.Option("--flash-attn", help="Flash attention: auto (from this machine's measurements, per context), on or off.")]
CacheTypeK = Annotated[str, typer.Option("--cache-type-k", "--ctk", help="The KV cache's K type: f16, bf16, f32, q8_0, q5_1, q5_0, q4_1, q4_0 or iq4_nl (a quantized cache holds a longer context in the same memory).")]
CacheTypeV = Annotated[str, typer.Option("--cache-type-v", "--ctv", help="The KV cache's V type, as --cache-type-k; a quantized V needs flash attention (auto turns it on).")]
Offline = Annotated[bool, typer.Option("--offline", help="Never open a network connection (also TALLOW_OFFLINE=1).")]
Json = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout instead of text.")]
JsonList = Annotated[bool, typer.Option("--json", help="Print a JSON array on stdout (one object per entry) instead of text.")]
Stats = Annotated[bool, typer.Option("--stats", help="Print the stats line even when stderr is not a terminal.")]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="Never print the stats line.")]

System = Annotated[Optional[str], typer.Option("--system", help="A system prompt.", show_default=False)]
def finite(value: float | None) -> float | None:
    """A float option's check that its range cannot make: NaN passes every comparison."""
    import math

    if value is not None and not math.isfinite(value):
        raise typer.BadParameter(f"{value} is not a finite number")
    return value


# the request fields' flags: their names, ranges and help from the field table (common/fields.py)
MaxTokens = option("max_tokens")
Stop = option("stop")
ServeSeed = option("seed", "Seed for requests that give none [default: a fresh one each].")
Image = Annotated[Optional[list[str]], typer.Option("--image", "-i", help="Show the model this image (repeatable; '-' reads it from stdin); needs a projector.", show_default=False)]
Video = Annotated[Optional[list[str]], typer.Option("--video", help="Show the model this video's frames (MP4, WebM, MKV, MOV, AVI, GIF; repeatable; '-' reads it from stdin), each as an image with its time; needs a projector and tallow[video].", show_default=False)]
VideoFps = Annotated[float, typer.Option("--video-fps", min=0.01, max=30.0, help="Frames taken from each second of a --video (fewer when the clip is long, or its frames would fill more than half the context).")]
Audio = Annotated[Optional[list[str]], typer.Option("--audio", help="Let the model hear this audio file: WAV, or MP3, FLAC, Ogg, M4A, WebM with tallow[speech] (repeatable; '-' reads it from stdin); needs a projector with an audio encoder.", show_default=False)]
Mmproj = Annotated[Optional[Path], typer.Option("--mmproj", help="A projector (mmproj GGUF) for the model, in place of the one stored with it.", show_default=False)]
Raw = Annotated[bool, typer.Option("--raw", help="Send the prompt as is, without the model's chat template.")]
HideThinking = Annotated[bool, typer.Option("--hide-thinking", help="Do not show a reasoning model's thinking (it is still counted).")]
Draft = Annotated[Optional[str], typer.Option("--draft", help="Speculative decoding: 'lookup' drafts from the prompt and output so far; a MODEL (stored, a path or a reference) of the same vocabulary drafts with that model; 'auto' picks a small stored one, or none. The answer is the same.", show_default=False)]
DraftMax = Annotated[int, typer.Option("--draft-max", min=1, max=64, help="With --draft MODEL: the most tokens drafted in one step.")]
DraftMin = Annotated[int, typer.Option("--draft-min", min=0, max=64, help="With --draft MODEL: the fewest (0: drafting stops where it does not pay).")]
DraftPMin = Annotated[float, typer.Option("--draft-p-min", min=0.0, max=1.0, help="With --draft MODEL: stop a draft where the draft model's top probability falls under this.")]
Format = Annotated[Optional[str], typer.Option("--format", help="'json': the answer is always one JSON object (grammar-constrained).", show_default=False)]
Grammar = Annotated[Optional[str], typer.Option("--grammar", help="A GBNF grammar (a file, or the grammar itself) the answer must follow, as llama.cpp's.", show_default=False)]
JsonSchema = Annotated[Optional[str], typer.Option("--json-schema", help="A JSON schema (a file, or the JSON itself) the answer must follow.", show_default=False)]
Lora = Annotated[Optional[list[str]], typer.Option("--lora", help="A LoRA adapter (GGUF) to load with the model, FILE or FILE:SCALE (repeatable; the scale defaults to 1, 0 loads it unapplied).", show_default=False)]
Think = Annotated[Optional[str], typer.Option("--think", help="Whether a reasoning model thinks, as Ollama's think: on, off, or an effort (low, medium, high: a budget of 512, 2048, 8192 tokens); instead of --reasoning-budget.", show_default=False)]
ReasoningBudget = Annotated[Optional[int], typer.Option("--reasoning-budget", min=0, max=2**31, help="Tokens a reasoning model may think for (its closing marker included) before its thinking is closed and it answers; 0: no thinking [default: no cap].", show_default=False)]
NoCache = Annotated[bool, typer.Option("--no-cache", help="Neither load nor save prompt prefixes in the disk cache.")]
ToolFormat = Annotated[str, typer.Option("--tool-format", help="Tool-call format: auto (from the chat template), hermes, llama3, mistral or generic.")]
NoLog = Annotated[bool, typer.Option("--no-log", help="Do not record this in the history log (also TALLOW_NO_LOG=1).")]
Parallel = Annotated[int, typer.Option("--parallel", "-p", min=1, max=256, help="Requests decoded together (continuous batching).")]
Deterministic = Annotated[bool, typer.Option("--deterministic", help="Answers that do not depend on the other requests in the batch (slower; see docs/serving.md).")]
KvUnified = Annotated[bool, typer.Option("--kv-unified", help="One KV buffer for all sequences, so one request may use all of --ctx (requests wait for room); default: --ctx split evenly.")]
OnOverflow = Annotated[str, typer.Option("--on-overflow", help="When the conversation outgrows the context: drop (the oldest turns, with a notice) or error.")]
Endpoint = Annotated[Optional[list[str]], typer.Option("--endpoint", help="Send the requests to this OpenAI-compatible server (its base URL, e.g. http://127.0.0.1:8080/v1) instead of a local engine (also TALLOW_ENDPOINT).", show_default=False)]
EndpointKey = Annotated[Optional[str], typer.Option("--api-key", help="With --endpoint: the server's API key, sent as a Bearer token (also TALLOW_ENDPOINT_KEY).", show_default=False)]


def endpoints(urls: list[str] | None, key: str | None, offline: bool, many: bool = False) -> list:
    """The servers --endpoint (or TALLOW_ENDPOINT) names, checked; [] for the local engine.
    Offline, a host that is not this machine is refused before anything connects."""
    from tallow.env import settings

    urls = list(urls or []) or settings.endpoints()
    if len(urls) > 1 and not many:
        raise typer.BadParameter("give one server (tallow batch spreads over several)", param_hint="--endpoint")
    if len(set(urls)) != len(urls):
        raise typer.BadParameter("the same server is named twice", param_hint="--endpoint")
    if key is not None and not urls:
        raise typer.BadParameter("an API key is for an --endpoint server: give --endpoint", param_hint="--api-key")
    if not urls:
        return []
    from tallow.client.endpoint import Endpoint  # an HTTP client: only for a command that uses one

    key = key or settings.endpoint_key()
    return [Endpoint.parse(u, key, offline or settings.offline()) for u in urls]


def refuse_local(given: dict[str, bool]) -> None:
    """With --endpoint, a flag of the local engine would be silently ignored: refuse it by name."""
    for flag, used in given.items():
        if used:
            raise typer.BadParameter(f"{flag} sets the local engine; with --endpoint the server decides it",
                                     param_hint=flag)


def load_settings(ctx: int | None, threads: int | None, gpu_layers: str, flash_attn: str, type_k: str = "f16",
                  type_v: str = "f16"):
    from dataclasses import replace

    from tallow.env.machine import load_settings as checked_load

    load = checked_load(ctx, threads, parse_gpu_layers(gpu_layers), parse_flash_attn(flash_attn))
    return replace(load, type_k=type_k, type_v=type_v)


def cache_types(type_k: str, type_v: str, flash_attn: str, where: str = "") -> tuple[str, str, str]:
    """The KV cache types, checked, and the flash attention they need: a quantized V cache
    works only with flash attention in llama.cpp, so "auto" becomes "on" (with a note) and
    "off" is refused. `where`: the flags' context in messages (a served model's name)."""
    from tallow.cli.render import err_console
    from tallow.models.memory import KV_TYPES, UNQUANTIZED_KV

    type_k, type_v, flash_attn = type_k.lower(), type_v.lower(), parse_flash_attn(flash_attn)
    for value, flag in ((type_k, "--cache-type-k"), (type_v, "--cache-type-v")):
        if value not in KV_TYPES:
            raise typer.BadParameter(f"unknown KV cache type {value!r}{where}: use one of {', '.join(KV_TYPES)}",
                                     param_hint=flag)
    if type_v not in UNQUANTIZED_KV:
        if flash_attn == "off":
            raise typer.BadParameter(f"a quantized V cache ({type_v}{where}) needs flash attention: drop "
                                     "--flash-attn off, or keep V at f16", param_hint="--cache-type-v")
        if flash_attn == "auto":
            err_console().print(f"note: flash attention on{where}: a quantized V cache ({type_v}) needs it",
                                markup=False, highlight=False)
            flash_attn = "on"
    return type_k, type_v, flash_attn


def read_media(images: list[str] | None, audio: list[str] | None, videos: list[str] | None = None,
               fps: float = 1.0) -> list:
    """The --image, --audio and --video files, decoded and checked before any model is loaded
    (a video as its frames, with a note on stderr when fewer were taken); one of them may be
    '-', read from stdin."""
    from tallow.cli.render import err_console
    from tallow.runtime.media import MediaError, decode_image
    from tallow.runtime.media.audio import decode_audio
    from tallow.runtime.media.video import decode_video

    def frames(raw: bytes, name: str) -> list:
        taken, note = decode_video(raw, name, fps)
        if note:
            err_console().print(f"note: {note}", soft_wrap=True, markup=False)
        return taken

    given = ([(p, "image", decode_image) for p in images or ()] + [(p, "audio", decode_audio) for p in audio or ()]
             + [(p, "video", frames) for p in videos or ()])
    if sum(p == "-" for p, _, _ in given) > 1:
        raise typer.BadParameter("only one --image, --audio or --video can read stdin ('-')", param_hint="--image")
    out: list = []
    for p, noun, decode in given:
        if p == "-":
            raw, name = sys.stdin.buffer.read(), f"the {noun} on stdin"
        else:
            try:
                raw, name = Path(p).read_bytes(), f"the {noun} {p}"
            except OSError as exc:
                raise MediaError(f"cannot read the {noun} {p}: {exc.strerror or exc}") from None
        got = decode(raw, name)
        out.extend(got if isinstance(got, list) else [got])
    return out


def loras(values: list[str] | None, where: str = "--lora") -> tuple:
    """--lora FILE[:SCALE] values as runtime.types.LoraSpec, each file checked to exist."""
    import math

    from tallow.runtime.types import LoraSpec

    out = []
    for value in values or ():
        path, scale = value, 1.0
        head, sep, tail = value.rpartition(":")
        if sep and head:
            try:
                scale = float(tail)
                path = head
            except ValueError:
                pass  # a path with a colon in it
        if not math.isfinite(scale) or abs(scale) > 100:
            raise typer.BadParameter(f"{value!r}: the scale must be a number between -100 and 100", param_hint=where)
        if not Path(path).expanduser().is_file():
            raise typer.BadParameter(f"no adapter file {path}", param_hint=where)
        out.append(LoraSpec(Path(path).expanduser().resolve(), scale))
    return tuple(out)


def checked_mmproj(mmproj: Path | None) -> Path | None:
    if mmproj is not None and not mmproj.is_file():
        raise typer.BadParameter(f"no projector file {mmproj}", param_hint="--mmproj")
    return mmproj


def one_shot(load, text: str, max_tokens: int | None, draft: bool):
    """A run's load settings once its prompt is known: the work it will do decides flash
    attention ("auto"), and drafting needs flash attention on, whose kernel treats each row
    of a batch as it treats a row alone (the draft's answer must equal the plain one)."""
    from dataclasses import replace

    from tallow.runtime.calibration.machine import Workload

    work = Workload(len(text.encode("utf-8")) // 3 + 16, max_tokens or 512)  # ~3 bytes a token, and the template
    return replace(with_draft(load, "lookup" if draft else None), workload=work)


def with_draft(load, draft: str | None):
    """serve and batch: `--draft lookup` for every request turns flash attention on (when
    "auto"), as `run` does, so that drafted answers equal plain ones."""
    from dataclasses import replace

    return replace(load, flash_attn="on") if draft is not None and load.flash_attn == "auto" else load


def parse_on_overflow(value: str) -> str:
    if value in ("drop", "error"):
        return value
    raise typer.BadParameter("use drop or error", param_hint="--on-overflow")


def parse_gpu_layers(value: str) -> str:
    value = value.strip().lower()
    if value in ("auto", "all") or (value.isdigit()):
        return value
    raise typer.BadParameter("use auto, all, or a number of layers", param_hint="--gpu-layers")


def placement(device: str | None, main_gpu: int = 0, split_mode: str = "layer", tensor_split: str | None = None):
    """--device, --main-gpu, --split-mode and --tensor-split, checked (whether the devices
    exist is the load's to say: runtime/host/devices.gpu_handles)."""
    from tallow.runtime.types import Placement

    devices = tuple(d.strip() for d in (device or "").split(",") if d.strip())
    if device is not None and not devices:
        raise typer.BadParameter("name one or more devices, e.g. Vulkan0 or CUDA0,CUDA1", param_hint="--device")
    mode = split_mode.strip().lower()
    if mode not in Placement.SPLIT_MODES:
        raise typer.BadParameter(f"{split_mode!r}: use none, layer or row", param_hint="--split-mode")
    if devices and main_gpu >= len(devices):
        raise typer.BadParameter(f"{main_gpu} is not an index into the {len(devices)} device(s) of --device",
                                 param_hint="--main-gpu")
    shares: tuple[float, ...] = ()
    if tensor_split is not None:
        try:
            shares = tuple(float(v) for v in tensor_split.split(","))
        except ValueError:
            shares = (-1.0,)
        if not shares or min(shares) < 0 or sum(shares) <= 0 or (devices and len(shares) > len(devices)):
            raise typer.BadParameter("give each GPU's share as numbers >= 0, one per device (e.g. 3,1)",
                                     param_hint="--tensor-split")
    return Placement(devices, main_gpu, mode, shares)


def parse_flash_attn(value: str) -> str:
    value = value.strip().lower()
    if value in ("auto", "on", "off"):
        return value
    raise typer.BadParameter("use auto, on or off", param_hint="--flash-attn")


def parse_tool_format(value: str) -> str | None:
    """None for auto (the chat template decides), else the format family named."""
    from tallow.runtime.tools.formats import FORMATS

    if value == "auto":
        return None
    if value not in FORMATS:
        raise typer.BadParameter(f"{value!r} is not a tool-call format; use auto, {', '.join(FORMATS)}",
                                 param_hint="--tool-format")
    return value


DRAFT_DEFAULTS = (16, 0, 0.75)  # --draft-max, --draft-min, --draft-p-min


def parse_draft(value: str | None) -> str | None:
    """The request's draft method for --draft: "lookup", "model" (a draft model) or None."""
    return value if value in (None, "lookup") else "model"  # "auto" finds a model, or drafting is off


def draft_limits_given(most: int, fewest: int, p_min: float) -> bool:
    return (most, fewest, p_min) != DRAFT_DEFAULTS


def draft_model(load, value: str | None, offline: bool, most: int, fewest: int, p_min: float, target: str = ""):
    """The load settings with --draft MODEL's files and limits (found, or pulled, as any
    model); `--draft auto` picks a stored model for `target` (models/draft_pick.py), or none."""
    from dataclasses import replace

    from tallow.runtime.types import DraftLimits

    if fewest > most:
        raise typer.BadParameter(f"--draft-min {fewest} is more than --draft-max {most}", param_hint="--draft-min")
    if value in (None, "lookup"):
        if draft_limits_given(most, fewest, p_min):
            raise typer.BadParameter("the draft limits are for a draft model: give --draft MODEL", param_hint="--draft-max")
        return load
    from tallow.cli.models import find_model

    local = _auto_draft(find_model(target, offline)) if value == "auto" else find_model(value, offline)
    if local is None:
        return load
    return replace(load, draft=tuple(local.paths), draft_limits=DraftLimits(most, fewest, p_min), draft_name=local.name)


def _auto_draft(target):
    """--draft auto's choice for a target (a LocalModel), said on stderr either way."""
    from tallow.cli.models import store
    from tallow.cli.render import err_console
    from tallow.models.draft_pick import SMALL_FRACTION, pick_draft

    local = pick_draft(target, store())
    err_console().print(f"--draft auto: drafting with {local.name}" if local is not None else
                        f"--draft auto: no stored model shares {target.name}'s vocabulary at under "
                        f"{SMALL_FRACTION:.0%} of its size, so nothing drafts", soft_wrap=True, markup=False)
    return local


def structured(format_: str | None, json_schema: str | None, grammar: str | None = None):
    """(grammar, schema) for --format / --json-schema / --grammar; errors before anything is loaded."""
    from tallow.runtime.grammar import check_gbnf, grammar_for, load_schema

    if format_ not in (None, "json"):
        raise typer.BadParameter("the only format is 'json'", param_hint="--format")
    if grammar is not None:
        if format_ is not None or json_schema is not None:
            raise typer.BadParameter("a grammar constrains the whole answer: give it without --format or "
                                     "--json-schema", param_hint="--grammar")
        text = grammar if "::=" in grammar else _read_text(grammar, "--grammar")
        check_gbnf(text)
        return text, None
    schema = None
    if json_schema is not None:
        text = json_schema
        if not json_schema.lstrip().startswith(("{", "true", "false")):
            text = _read_text(json_schema, "--json-schema")
        schema = load_schema(text)
    return grammar_for(format_ == "json", schema), schema


def _read_text(path: str, flag: str) -> str:
    from pathlib import Path

    try:
        return Path(path).expanduser().read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise typer.BadParameter(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}", param_hint=flag) from exc


def check_structured(text: str, finish_reason: str, schema) -> None:
    """The grammar makes every complete answer parse; say so loudly when it is not complete."""
    import json

    from tallow.common.errors import TallowError

    if finish_reason != "stop":
        raise TallowError(f"the JSON answer was cut ({finish_reason}) and is incomplete", "raise --max-tokens or --ctx")
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise TallowError(f"the answer is not valid JSON: {exc}") from exc
    if schema is not None:
        from jsonschema import ValidationError
        from jsonschema.validators import validator_for

        try:
            validator_for(schema)(schema).validate(value)
        except ValidationError as exc:
            raise TallowError(f"the answer does not follow the schema: {exc.message}") from exc


Pooling = Annotated[Optional[str], typer.Option("--pooling", help="How token vectors become one: mean, cls, last, or rank (a reranker) [default: the model's own; mean if it has none].", show_default=False)]
Truncate = Annotated[bool, typer.Option("--truncate", help="Cut an input longer than the model takes to fit (default: such an input is an error).")]
NoNormalize = Annotated[bool, typer.Option("--no-normalize", help="Return vectors as pooled, not scaled to unit length.")]
Dimensions = Annotated[Optional[int], typer.Option("--dimensions", min=1, help="Keep the first N dimensions, then normalize (Matryoshka; meant for models trained for it).", show_default=False)]
EmbedBatch = Annotated[int, typer.Option("--batch-size", min=32, max=16384, help="Tokens per llama_decode: inputs are packed into each as separate sequences.")]


def embed_settings(threads: int | None, gpu_layers: str, pooling: str | None, batch_size: int):
    """Load settings for an embedding model (runtime/embedding/embed.py): no sampling, a context of one batch."""
    from dataclasses import replace

    from tallow.common.errors import TallowError
    from tallow.models.convert.bert_import import POOLING

    if pooling is not None and (pooling not in POOLING or pooling == "none"):
        raise TallowError(f"--pooling must be mean, cls, last or rank, not {pooling!r}")
    return replace(load_settings(None, threads, gpu_layers, "auto"), n_batch=batch_size, pooling=pooling)


def thinking(think: str | None, budget: int | None) -> int | None:
    """--think or --reasoning-budget as the one reasoning budget (None: no cap)."""
    from tallow.common.fields import FieldError, think_budget

    if think is None:
        return budget
    if budget is not None:
        raise typer.BadParameter("give --think or --reasoning-budget, not both", param_hint="--think")
    try:
        return think_budget(think, "--think")
    except FieldError as exc:
        raise typer.BadParameter(exc.message, param_hint="--think") from None
