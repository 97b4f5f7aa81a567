"""LoRA adapters in GGUF (`general.type` adapter, `adapter.type` lora), as llama.cpp's
converter writes them: for a base weight W (GGUF shape [n_in, n_out]) the pair
`<name>.lora_a` [n_in, rank] and `<name>.lora_b` [rank, n_out], so that the adapted layer
computes W x + scale * alpha / rank * B A x.

Read from the header alone, and checked against the model before llama.cpp sees either:
another architecture, or a tensor the model lacks or has in another width, is refused
naming both files."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tallow.models.errors import TallowError
from tallow.models.gguf_file import GGUFInfo, read_gguf


class AdapterError(TallowError):
    """An adapter file that is not one, or that does not fit the model."""


@dataclass(frozen=True)
class AdapterFacts:
    path: Path
    architecture: str
    alpha: float | None  # adapter.lora.alpha; None: scale alone
    pairs: dict[str, tuple[tuple[int, ...], tuple[int, ...]]]  # base tensor -> (lora_a shape, lora_b shape)
    task_name: str = ""
    prompt_prefix: str = ""

    @property
    def rank(self) -> int:
        return next(iter(self.pairs.values()))[0][1] if self.pairs else 0


def read_adapter(path: Path) -> AdapterFacts:
    """The adapter's facts; AdapterError for a file that is no LoRA adapter."""
    path = Path(path)
    try:
        info = read_gguf(path)
    except TallowError as exc:
        raise AdapterError(f"{path.name}: {exc.message}", exc.hint) from None
    meta = info.metadata
    if meta.get("general.type") != "adapter" or meta.get("adapter.type") != "lora":
        raise AdapterError(f"{path.name} is not a LoRA adapter (its general.type is {meta.get('general.type')!r}, "
                           f"adapter.type {meta.get('adapter.type')!r})",
                           "a GGUF LoRA comes from llama.cpp's convert_lora_to_gguf.py or tallow import --base")
    if "adapter.alora.invocation_tokens" in meta:
        raise AdapterError(f"{path.name} is an activated LoRA (aLoRA), which tallow does not apply",
                           "use a plain LoRA adapter")
    arch = info.architecture or "?"
    shapes = {t.name: t.shape for t in info.tensors}
    pairs: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {}
    for name, shape in shapes.items():
        if name.endswith(".lora_a"):
            base = name.removesuffix(".lora_a")
            b = shapes.get(base + ".lora_b")
            if b is None or len(shape) != 2 or len(b) != 2 or shape[1] != b[0]:
                raise AdapterError(f"{path.name}: {base} has no matching lora_a and lora_b pair")
            pairs[base] = (shape, b)
    if not pairs:
        raise AdapterError(f"{path.name} holds no lora_a/lora_b tensors")
    alpha = meta.get("adapter.lora.alpha")
    return AdapterFacts(path, arch, float(alpha) if isinstance(alpha, (int, float)) else None, pairs,
                        str(meta.get("adapter.lora.task_name") or ""), str(meta.get("adapter.lora.prompt_prefix") or ""))


def check_fits(facts: AdapterFacts, model: GGUFInfo, model_name: str) -> None:
    """AdapterError unless every tensor the adapter changes is in the model, in its width."""
    if facts.architecture != model.architecture:
        raise AdapterError(f"the adapter {facts.path.name} is for {facts.architecture}, but {model_name} is "
                           f"{model.architecture}", "use an adapter trained for this model")
    weights = {t.name: t.shape for t in model.tensors}
    width = model.metadata.get(f"{model.architecture}.embedding_length")
    for name, (a, b) in facts.pairs.items():
        shape = weights.get(name)
        if shape is None:
            raise AdapterError(f"the adapter {facts.path.name} changes {name}, which {model_name} does not have",
                               "use an adapter trained for this model")
        if len(shape) < 2 or a[0] != shape[0] or b[1] != shape[1]:
            raise AdapterError(f"the adapter {facts.path.name} changes {name} as [{a[0]}, {b[1]}], but {model_name} "
                               f"has it as [{shape[0]}, {shape[1]}] (width {width})",
                               "use an adapter trained for this model")


def check_adapters(paths: list[Path], model_paths: list[Path], model_name: str | None = None) -> list[AdapterFacts]:
    """The adapters' facts, each checked against the model (named `model_name`, else by its
    GGUF's general.name, else its file's name)."""
    model = read_gguf(model_paths[0])
    given = model.metadata.get("general.name")
    model_name = model_name or (f"the model ({given})" if isinstance(given, str) and given else Path(model_paths[0]).name)
    for extra in model_paths[1:]:  # a sharded model's tensors are spread over its files
        model.tensors.extend(read_gguf(extra).tensors)
    facts = [read_adapter(p) for p in paths]
    for f in facts:
        check_fits(f, model, model_name)
    return facts
