"""Projectors ("mmproj" GGUFs, `general.architecture = clip`): what one is, what it can take,
whether it fits a text model, and which of a repository's projectors goes with which weights.

The checks here read headers only, so `import` and `pull` refuse a wrong projector before
anything is loaded; llama.cpp's own load of the pair (runtime/calibration/probe.py, in a
child) then has the last word, as it does for the weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tallow.models.errors import GGUFError, ModelNotFound, TallowError
from tallow.models.gguf_file import GGUFInfo, read_gguf
from tallow.models.hub import HubFile, quant_of

# The projector types libmtmd knows (clip-impl.h's PROJECTOR_TYPE_NAMES, llama.cpp as
# vendored by llama-cpp-python 0.3.36).
KNOWN_TYPES = frozenset("""
mlp ldp ldpv2 resampler adapter qwen2vl_merger qwen2.5vl_merger qwen3vl_merger ling3vl step3vl gemma3 gemma3nv
gemma3na gemma4v gemma4a gemma4uv gemma4ua phi4 idefics3 pixtral ultravox internvl llama4 qwen2a qwen3a glma
qwen2.5o voxtral meralion musicflamingo lfm2 kimivl paddleocr lightonocr cogvlm janus_pro dots_ocr dots3note_v
dots3note_a deepseekocr deepseekocr2 deepseek4v lfm2a glm4v glm5v youtuvl yasa2 kimik25 nemotron_v2_vl exaone4_5
hunyuanvl minicpmv4_6 granite_speech mimovl minimax_m3 granite4_vision mimo_audio parakeet qwen3tts_spkenc
qwen3tts_gen pockettts_spkenc pockettts_gen muse-glimmer
""".split())

# Where libmtmd reads a projector's output width (clip_n_mmproj_embd), for the common types:
# (tensor, dimension). Other types are left to llama.cpp's own check of the pair.
_WIDTH = {
    **{t: ("mm.2.weight", 1) for t in ("mlp", "pixtral", "phi4", "lightonocr", "lfm2", "kimivl")},
    **{t: ("mm.a.mlp.2.weight", 1) for t in ("ultravox", "voxtral", "qwen3a")},
    "qwen2a": ("mm.a.fc.weight", 1),
    **{t: ("mm.2.bias", 0) for t in ("qwen2vl_merger", "qwen2.5vl_merger")},  # loaded as mm_1_b
    **{t: ("mm.input_projection.weight", 0) for t in ("gemma3", "gemma3nv")},
    "idefics3": ("mm.model.fc.weight", 1),
    "internvl": ("mm.3.weight", 1),
}


@dataclass(frozen=True)
class ProjectorFacts:
    types: tuple[str, ...]  # one per encoder: vision, then audio
    vision: bool
    audio: bool
    width: int | None  # the embeddings' width, where read from the header
    parameters: int
    file_type: str | None

    @property
    def capabilities(self) -> list[str]:
        return [c for c, on in (("vision", self.vision), ("audio", self.audio)) if on]

    def to_json(self) -> dict[str, Any]:
        return {"types": list(self.types), "capabilities": self.capabilities, "width": self.width,
                "parameters": self.parameters, "file_type": self.file_type}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ProjectorFacts:
        caps = d.get("capabilities") or []
        width = d.get("width")
        return cls(tuple(str(t) for t in d.get("types") or ()), "vision" in caps, "audio" in caps,
                   int(width) if width is not None else None, int(d.get("parameters") or 0), d.get("file_type"))


def _types(md: dict[str, Any], path: Path) -> tuple[str, ...]:
    found = [md.get(k) for k in ("clip.projector_type", "clip.vision.projector_type", "clip.audio.projector_type")]
    names = tuple(dict.fromkeys(t for t in found if isinstance(t, str)))
    if not names:
        # An old LLaVA projector names no type: libmtmd reads it as "mlp".
        return ("mlp",)
    for name in names:
        if name not in KNOWN_TYPES:
            raise GGUFError(f"{path.name} is a projector of type {name!r}, which this llama.cpp does not know",
                            "update tallow (and llama-cpp-python), or use a projector made for a supported model")
    return names


def facts_of(info: GGUFInfo, path: Path) -> ProjectorFacts:
    """A projector's facts from its header; a file that is not one is refused by name."""
    if info.architecture != "clip":
        raise GGUFError(f"{path.name} is not a projector: its general.architecture is {info.architecture!r}, not 'clip'",
                        "a projector is the repository's mmproj-*.gguf file")
    md = info.metadata
    vision = md.get("clip.has_vision_encoder") is True
    audio = md.get("clip.has_audio_encoder") is True
    if not (vision or audio):
        raise GGUFError(f"{path.name} is a projector with no vision or audio encoder")
    types = _types(md, path)
    width = None
    where = _WIDTH.get(types[0])
    if where is not None:
        tensor = next((t for t in info.tensors if t.name == where[0]), None)
        if tensor is None or len(tensor.shape) <= where[1]:
            raise GGUFError(f"{path.name}: a {types[0]} projector without its {where[0]} tensor", "the file is damaged")
        width = tensor.shape[where[1]]
    return ProjectorFacts(types, vision, audio, width, info.n_params, info.file_type)


def read_projector(path: Path) -> ProjectorFacts:
    return facts_of(read_gguf(path), Path(path))


def model_width(info: GGUFInfo) -> int | None:
    value = info.metadata.get(f"{info.architecture}.embedding_length")
    return value if isinstance(value, int) else None


def check_pair(facts: ProjectorFacts, model: GGUFInfo, proj_label: str, model_label: str) -> None:
    """A projector whose embeddings are not as wide as the model's input is refused, with both figures."""
    width = model_width(model)
    if facts.width is not None and width is not None and facts.width != width:
        raise TallowError(f"{proj_label} gives embeddings {facts.width} wide, but {model_label} takes {width}: "
                          "it is not this model's projector", "use the projector from the model's own repository")


def is_projector_path(path: str) -> bool:
    """How a repository names its projectors (mmproj-*.gguf, *-mmproj-*.gguf)."""
    return "mmproj" in path.rsplit("/", 1)[-1].lower()


def choose_projector(repo: str, files: list[HubFile], weights_quant: str | None, wanted: str | None) -> HubFile | None:
    """The projector to pull with weights of precision `weights_quant`, among a repository's
    files: the one named by --mmproj (a file or a precision), else the only
    one, else the one of the weights' precision, else F16; None when the repository has none."""
    projectors = sorted((f for f in files if is_projector_path(f.path)), key=lambda f: f.path)
    names = ", ".join(f.path for f in projectors) or "none"
    if wanted is not None:
        hits = [f for f in projectors if wanted in (f.path, f.path.rsplit("/", 1)[-1])]
        hits = hits or [f for f in projectors if (quant_of(f.path) or "").upper() == wanted.upper()]
        if len(hits) != 1:
            raise ModelNotFound(f"{repo} has {'several projectors of' if hits else 'no projector'} {wanted!r}",
                                f"its projectors: {names}")
        return hits[0]
    if len(projectors) <= 1:
        return projectors[0] if projectors else None
    for precision in (weights_quant, "F16"):
        hits = [f for f in projectors if precision and (quant_of(f.path) or "").upper() == precision.upper()]
        if len(hits) == 1:
            return hits[0]
    raise ModelNotFound(f"{repo} has several projectors and none is F16 or of the weights' precision",
                        f"choose one with --mmproj NAME: {names}")


# Vision types that take a picture at its own resolution, up to libmtmd's token limit:
# (most output tokens, input patches per output token), from clip.cpp's set_limit_image_tokens.
_DYNAMIC = {"qwen2vl_merger": (4096, 4), "qwen2.5vl_merger": (4096, 4), "qwen3vl_merger": (4096, 4)}


def projector_memory(info: GGUFInfo) -> tuple[int, int]:
    """(weights, compute buffer) of a projector: the tensors as stored, and an upper bound on
    the encoder's peak for its largest input. The encoder runs flash attention (see
    runtime/backend/media.py), so no patch-pair scores are kept: the peak is the input with
    its unfolded copy for the first convolution, plus the feed-forward activations beside the
    residual stream. Checked against libmtmd's own reservation (tests/test_projector_memory.py)."""
    md = info.metadata
    weights = sum(t.n_bytes for t in info.tensors)
    vision = md.get("clip.has_vision_encoder") is True
    audio = md.get("clip.has_audio_encoder") is True
    compute = [_vision_peak(md) if vision else 0, _audio_peak(md) if audio else 0]
    return weights, max(compute)


def _num(md: dict[str, Any], key: str, default: int = 0) -> int:
    value = md.get(key, default)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else default


def _stream(md: dict[str, Any], modality: str, positions: int) -> int:
    width = _num(md, f"clip.{modality}.embedding_length", 1)
    ffn = _num(md, f"clip.{modality}.feed_forward_length", 1)
    return positions * (ffn + 4 * width) * 4


def _vision_peak(md: dict[str, Any]) -> int:
    patch = _num(md, "clip.vision.patch_size", 14)
    kind = md.get("clip.vision.projector_type") or md.get("clip.projector_type")
    if kind in _DYNAMIC:
        tokens, per_token = _DYNAMIC[kind]
        patches = tokens * per_token
    else:
        patches = (_num(md, "clip.vision.image_size", 224) // patch) ** 2
    pixels = patches * patch * patch
    return 2 * pixels * 3 * 4 + _stream(md, "vision", patches)


def _audio_peak(md: dict[str, Any]) -> int:
    frames, mels = 3000, _num(md, "clip.audio.num_mel_bins", 128)  # Whisper's 30 s window
    return 4 * frames * mels * 4 + _stream(md, "audio", frames // 2)
