"""A PEFT LoRA adapter (adapter_config.json, adapter_model.safetensors) converted to a GGUF
adapter for a stored base model, with numpy and safetensors, without torch.

PEFT names a pair by the Hugging Face module (`...layers.3.self_attn.q_proj.lora_A.weight`,
A of shape (rank, in), B of shape (out, rank)); GGUF names it by the base's tensor
(`blk.3.attn_q.weight.lora_a`) and holds the same arrays. One change of layout: llama.cpp's
converter reorders the rows of a llama model's Q and K weights (rotary halves interleaved,
head by head), so B, whose rows are the weight's, is reordered the same way. The result is
checked against the base's tensor shapes (models/adapter.py) before it is written."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np

from tallow.models.adapter import AdapterError, AdapterFacts, check_fits
from tallow.models.gguf_file import read_gguf

MODULES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
           "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
           "mlp.down_proj": "ffn_down"}
PERMUTED = ("llama",)  # architectures whose Q and K rows llama.cpp's converter reorders
_KEY = re.compile(r"^(?:base_model\.model\.)?(?:model\.)?(?:layers\.(\d+)\.(\w+\.\w+)|(lm_head))\.lora_([AB])(?:\.default)?\.weight$")


def is_peft_adapter(folder: Path) -> bool:
    return folder.is_dir() and (folder / "adapter_config.json").is_file()


def convert_peft(folder: Path, base_paths: list[Path], out: Path, base_name: str) -> AdapterFacts:
    """Write `folder`'s adapter as a GGUF adapter at `out` for the base model in `base_paths`."""
    config = _config(folder)
    base = read_gguf(base_paths[0])
    for extra in base_paths[1:]:
        base.tensors.extend(read_gguf(extra).tensors)
    arch = base.architecture or "?"
    pairs = _pairs(folder)
    heads = (base.metadata.get(f"{arch}.attention.head_count"), base.metadata.get(f"{arch}.attention.head_count_kv"))
    tensors: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for name, (a, b) in pairs.items():
        kind = name.split(".")[2] if name.startswith("blk.") else ""
        if arch in PERMUTED and kind in ("attn_q", "attn_k"):
            n_head = heads[0] if kind == "attn_q" else (heads[1] or heads[0])
            b = interleave_rope_rows(b, int(n_head or 1))
        tensors[name] = (a, b)
    alpha = float(config["lora_alpha"]) * (math.sqrt(int(config["r"])) if config.get("use_rslora") else 1.0)
    facts = AdapterFacts(folder, arch, alpha, {n: ((a.shape[1], a.shape[0]), (b.shape[1], b.shape[0]))
                                           for n, (a, b) in tensors.items()})
    check_fits(facts, base, base_name)
    _write(out, arch, alpha, tensors)
    return facts


def interleave_rope_rows(b: np.ndarray, n_head: int) -> np.ndarray:
    """B's rows in llama.cpp's order: within each head, the two rotary halves interleaved."""
    out = b.shape[0]
    return b.reshape(n_head, 2, out // n_head // 2, *b.shape[1:]).swapaxes(1, 2).reshape(b.shape)


def _config(folder: Path) -> dict[str, Any]:
    try:
        config = json.loads((folder / "adapter_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise AdapterError(f"cannot read {folder / 'adapter_config.json'}: {exc}") from None
    refusals = (("peft_type", lambda v: v not in (None, "LORA"), "is not LORA"),
                ("use_dora", bool, "DoRA needs a magnitude vector llama.cpp's adapters do not have"),
                ("fan_in_fan_out", bool, "transposed (Conv1D) weights are not converted"),
                ("bias", lambda v: v not in (None, "none"), "trained biases are not converted"),
                ("modules_to_save", bool, "whole trained modules are not an adapter"),
                ("rank_pattern", bool, "per-module ranks need per-module alphas, which GGUF adapters lack"),
                ("alpha_pattern", bool, "per-module alphas: GGUF adapters have one"))
    for key, refused, why in refusals:
        if refused(config.get(key)):
            raise AdapterError(f"{folder.name}: {key} = {config.get(key)!r}: {why}")
    if not isinstance(config.get("r"), int) or not isinstance(config.get("lora_alpha"), (int, float)):
        raise AdapterError(f"{folder.name}: adapter_config.json needs r and lora_alpha")
    return config


def _pairs(folder: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """GGUF base tensor name -> (A, B) as numpy, from the safetensors."""
    weights = folder / "adapter_model.safetensors"
    if not weights.is_file():
        raise AdapterError(f"{folder.name} has no adapter_model.safetensors",
                           "PyTorch .bin adapters need torch to read; save the adapter as safetensors")
    try:
        from safetensors import safe_open

        reader = safe_open(str(weights), framework="numpy")
        found: dict[str, dict[str, np.ndarray]] = {}
        for key in reader.keys():
            m = _KEY.match(key)
            if m is None or (m.group(2) is not None and m.group(2) not in MODULES):
                raise AdapterError(f"{folder.name}: {key} is not a LoRA weight of a module tallow converts "
                                   f"({', '.join(MODULES)}, lm_head)")
            name = "output.weight" if m.group(3) else f"blk.{m.group(1)}.{MODULES[m.group(2)]}.weight"
            found.setdefault(name, {})[m.group(4)] = reader.get_tensor(key).astype(np.float32)
    except AdapterError:
        raise
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types
        raise AdapterError(f"cannot read {weights}: {exc}") from None
    if not found:
        raise AdapterError(f"{folder.name}: adapter_model.safetensors holds no LoRA weights")
    for name, ab in found.items():
        if set(ab) != {"A", "B"} or ab["A"].ndim != 2 or ab["B"].shape[1:] != ab["A"].shape[:1]:
            raise AdapterError(f"{folder.name}: {name} has no matching lora_A and lora_B pair")
    return {name: (ab["A"], ab["B"]) for name, ab in sorted(found.items())}


def _write(out: Path, arch: str, alpha: float, tensors: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
    import gguf

    w = gguf.GGUFWriter(str(out), arch)
    w.add_type("adapter")
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", alpha)
    for name, (a, b) in tensors.items():
        w.add_tensor(f"{name}.lora_a", np.ascontiguousarray(a))
        w.add_tensor(f"{name}.lora_b", np.ascontiguousarray(b))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
