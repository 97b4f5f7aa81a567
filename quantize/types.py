"""The file types llama.cpp can quantize to, with bits per weight and a line on each.

Two figures per type. `block_bits` is the main tensor format alone (block bytes x 8 / block
weights): Q4_K_M and Q4_K_S share it. `typical_bpw` is what a whole file comes to, the mix
included (the tensors kept at higher precision, the embedding and output matrices): for
the k-quants and legacy types it is llama.cpp's own measured size for Llama-3-8B (8.03B
parameters) in its quantize tool's list, for the IQ and ternary types that list's nominal
figure. A given model's exact size per type comes from llama.cpp's dry run (run.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from tallow.common.errors import TallowError


@dataclass(frozen=True)
class QuantType:
    name: str
    ftype: int  # llama_ftype
    ggml: str  # the main ggml tensor type
    note: str
    typical_bpw: float
    needs_imatrix: bool = False

    @property
    def block_bits(self) -> float:
        from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

        block, size = GGML_QUANT_SIZES[GGMLQuantizationType[self.ggml]]
        return size * 8 / block


TYPES = [
    QuantType("F32", 0, "F32", "no quantization: 32-bit floats (a reference, twice F16's size)", 32.0),
    QuantType("F16", 1, "F16", "16-bit floats: lossless for most released models", 16.0),
    QuantType("BF16", 32, "BF16", "bfloat16: the range of F32 at half the size", 16.0),
    QuantType("Q8_0", 7, "Q8_0", "8-bit: nearly indistinguishable from F16", 8.52),
    QuantType("Q6_K", 18, "Q6_K", "6-bit k-quant: very small loss", 6.57),
    QuantType("Q5_K_M", 17, "Q5_K", "5-bit k-quant mix, some tensors at 6 bits: small loss", 5.7),
    QuantType("Q5_K_S", 16, "Q5_K", "5-bit k-quant: small loss", 5.57),
    QuantType("Q5_1", 9, "Q5_1", "legacy 5-bit with offsets", 6.04),
    QuantType("Q5_0", 8, "Q5_0", "legacy 5-bit", 5.57),
    QuantType("Q4_K_M", 15, "Q4_K", "4-bit k-quant mix, some tensors at 6 bits: the usual balance", 4.9),
    QuantType("Q4_K_S", 14, "Q4_K", "4-bit k-quant: a little smaller, a little more loss", 4.67),
    QuantType("Q4_1", 3, "Q4_1", "legacy 4-bit with offsets", 5.11),
    QuantType("Q4_0", 2, "Q4_0", "legacy 4-bit: fast on many CPUs, more loss than Q4_K", 4.64),
    QuantType("IQ4_NL", 25, "IQ4_NL", "4-bit non-linear: good quality per bit, better with an imatrix", 4.5),
    QuantType("IQ4_XS", 30, "IQ4_XS", "4.25-bit non-linear: better with an imatrix", 4.25),
    QuantType("Q3_K_L", 13, "Q3_K", "3-bit k-quant mix, more tensors kept larger: noticeable loss", 4.31),
    QuantType("Q3_K_M", 12, "Q3_K", "3-bit k-quant mix: noticeable loss", 4.0),
    QuantType("Q3_K_S", 11, "Q3_K", "3-bit k-quant: large loss", 3.65),
    QuantType("IQ3_M", 27, "IQ3_S", "3-bit non-linear mix: better with an imatrix", 3.66),
    QuantType("IQ3_S", 26, "IQ3_S", "3.4-bit non-linear: better with an imatrix", 3.44),
    QuantType("IQ3_XS", 22, "IQ3_S", "3.3-bit non-linear: better with an imatrix", 3.3),
    QuantType("IQ3_XXS", 23, "IQ3_XXS", "3-bit non-linear: needs an imatrix", 3.06, True),
    QuantType("Q2_K", 10, "Q2_K", "2-bit k-quant: very large loss", 3.17),
    QuantType("Q2_K_S", 21, "Q2_K", "2-bit k-quant, smaller: needs an imatrix", 3.17, True),
    QuantType("IQ2_M", 29, "IQ2_S", "2.7-bit non-linear mix: better with an imatrix", 2.7),
    QuantType("IQ2_S", 28, "IQ2_S", "2.5-bit non-linear: needs an imatrix", 2.5, True),
    QuantType("IQ2_XS", 20, "IQ2_XS", "2.3-bit non-linear: needs an imatrix", 2.31, True),
    QuantType("IQ2_XXS", 19, "IQ2_XXS", "2-bit non-linear: needs an imatrix", 2.06, True),
    QuantType("IQ1_M", 31, "IQ1_M", "1.75-bit: needs an imatrix; for very large models only", 1.75, True),
    QuantType("IQ1_S", 24, "IQ1_S", "1.5-bit: needs an imatrix; for very large models only", 1.56, True),
    QuantType("TQ2_0", 37, "TQ2_0", "ternary 2-bit: only for models trained ternary", 2.06),
    QuantType("TQ1_0", 36, "TQ1_0", "ternary 1.69-bit: only for models trained ternary", 1.69),
]

BY_NAME = {t.name: t for t in TYPES}
SOURCE_TYPES = {"F32", "F16", "BF16"}


def quant_type(name: str) -> QuantType:
    t = BY_NAME.get(name.upper())
    if t is None:
        raise TallowError(f"unknown quantization type {name!r}",
                          f"one of: {', '.join(t.name for t in TYPES)} (tallow quantize --list)")
    return t


def ggml_type_id(name: str) -> int:
    from gguf.constants import GGMLQuantizationType

    try:
        return int(GGMLQuantizationType[name.upper()])
    except KeyError:
        raise TallowError(f"unknown tensor type {name!r}", "use a ggml type such as Q8_0, Q6_K or F16") from None
