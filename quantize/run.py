"""Quantize a model into a new stored model, in a child process, leaving nothing behind on failure."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tallow.common.files import sha256_file
from tallow.models.download import check_disk, disk_free
from tallow.models.gguf_file import read_gguf
from tallow.models.preset import Preset
from tallow.models.pull import generation_preset, gguf_facts
from tallow.models.resolve import LocalModel
from tallow.models.store import Manifest, Store, StoredFile
from tallow.quantize.errors import QuantizeError
from tallow.quantize.types import SOURCE_TYPES, ggml_type_id, quant_type

ProgressFn = Callable[[int, int, str], None]  # (tensors done, tensors in all, tensor name)


@dataclass
class QuantizeOptions:
    type: str
    name: str
    imatrix: Path | None = None
    allow_requantize: bool = False
    leave_output_tensor: bool = False
    pure: bool = False
    output_tensor_type: str | None = None
    token_embedding_type: str | None = None
    threads: int = 0  # 0: llama.cpp decides
    free_space: Callable[[Path], int] = disk_free


def _plan(source: LocalModel, opts: QuantizeOptions):
    qt = quant_type(opts.type)
    if len(source.paths) > 1:
        raise QuantizeError(f"{source.name} is split into {len(source.paths)} files; tallow quantizes single-file models")
    info = read_gguf(source.path)  # bounded checks before llama.cpp sees the file
    have = info.file_type or "?"
    if have not in SOURCE_TYPES and not opts.allow_requantize:
        raise QuantizeError(f"{source.name} is already quantized ({have}); quantizing it again loses more quality than "
                            "quantizing the original", "start from an F16/BF16/F32 model, or pass --allow-requantize")
    if qt.needs_imatrix and opts.imatrix is None:
        raise QuantizeError(f"{qt.name} needs an importance matrix",
                            f"make one: tallow imatrix {source.name} --text FILE, then pass --imatrix")
    if opts.imatrix is not None:
        if not Path(opts.imatrix).is_file():
            raise QuantizeError(f"no such imatrix file: {opts.imatrix}")
        from tallow.quantize.imatrix import read_imatrix

        read_imatrix(opts.imatrix)  # a bad file is refused here, not in the child
    return qt, info


def quantize_model(source: LocalModel, store: Store, opts: QuantizeOptions, on_progress: ProgressFn | None = None,
                   converted: dict | None = None, preset: Preset | None = None) -> Manifest:
    qt, info = _plan(source, opts)
    estimate = int(info.n_params * max(qt.block_bits, 4.0) / 8 * 1.15) + (1 << 20)
    check_disk(store, estimate, f"the {qt.name} file", opts.free_space)
    try:
        output = store.temp_file(f".{qt.name}.gguf.partial")
    except OSError as exc:
        raise QuantizeError(f"cannot write in {store.tmp}: {exc.strerror or exc}", "check the permissions of TALLOW_MODELS") from exc
    try:
        _run_worker(source, output, qt, opts, on_progress)
        result = read_gguf(output)
        digest, size = store.adopt_written(output)
    finally:
        output.unlink(missing_ok=True)
    from importlib.metadata import version

    source_info = {"kind": "quantize", "from": source.name, "from_digest": source.sha256, "type": qt.name,
                   "imatrix_digest": sha256_file(Path(opts.imatrix)) if opts.imatrix else None,
                   "llama_cpp_python": version("llama-cpp-python"), "source_file_type": info.file_type,
                   **({"converted": converted} if converted else {})}
    origin = store.get(source.name) if source.mmproj is not None else None  # its projector goes with it
    manifest = Manifest(opts.name, [StoredFile(f"{opts.name.replace('/', '-')}.gguf", digest, size)], source_info,
                        None, gguf_facts([result]), projector=origin.projector if origin else None,
                        projector_facts=origin.projector_facts if origin else {}, preset=preset)
    store.commit(manifest)
    return manifest


def convert_quantized(source: Path, store: Store, opts: QuantizeOptions, dtype: str = "f16",
                      verify: Callable[[list[Path]], None] | None = None, on_progress: ProgressFn | None = None,
                      origin: dict | None = None) -> Manifest:
    """`tallow import DIR --quant TYPE`: a Hugging Face model converted (models/convert/) to a
    `dtype` GGUF, then quantized to TYPE and stored as opts.name; the intermediate file is
    removed, and the provenance names both steps."""
    from tallow.models.fetch import convert_into_store

    quant_type(opts.type)  # an unknown type is refused before the conversion's work
    digest, _, done = convert_into_store(source, store, dtype, verify=verify)
    try:
        where = origin or {"path": str(source)}
        local = LocalModel(str(next(iter(where.values()))), [store.blob_path(digest)], digest.removeprefix("sha256-"))
        return quantize_model(local, store, opts, on_progress,
                              converted={**where, "type": dtype, "architecture": done.architecture},
                              preset=generation_preset(done.sampling))
    finally:
        if digest not in store.digests_in_use():
            store.blob_path(digest).unlink(missing_ok=True)


def type_sizes(source: LocalModel) -> dict[str, tuple[int | None, float | None]]:
    """What the file would weigh in each type, and its bits per weight (the whole file, as
    `tallow eval` counts them), for this model: llama.cpp's dry run in the child plans every
    tensor as a real run would and writes nothing. None where llama.cpp refuses the type."""
    from tallow.quantize.types import TYPES

    if len(source.paths) > 1:
        raise QuantizeError(f"{source.name} is split into {len(source.paths)} files; tallow quantizes single-file models")
    info = read_gguf(source.path)  # bounded checks before llama.cpp sees the file
    by_ftype = {t.ftype: t.name for t in TYPES}
    args = {"source": str(source.path), "output": "/dev/null", "sizes": list(by_ftype)}
    proc = subprocess.run([sys.executable, "-m", "tallow.quantize.worker", json.dumps(args)], capture_output=True,
                          text=True, stdin=subprocess.DEVNULL, timeout=600)
    found: dict[str, tuple[int | None, float | None]] = {}
    for line in proc.stdout.splitlines():
        try:
            msg = json.loads(line)
            if not msg["bytes"]:
                found[by_ftype[msg["ftype"]]] = (None, None)
                continue
            # llama.cpp counts tensor data; the file also holds the header (metadata, vocabulary)
            size = msg["bytes"] + info.data_offset
            found[by_ftype[msg["ftype"]]] = (size, size * 8 / info.n_params if info.n_params else None)
        except (ValueError, KeyError, TypeError):
            continue
    if proc.returncode != 0 and not found:
        raise QuantizeError(f"llama.cpp could not plan the quantization of {source.name} (code {proc.returncode})",
                            "check that the file loads: tallow show MODEL")
    return found


def _run_worker(source: LocalModel, output: Path, qt, opts: QuantizeOptions, on_progress: ProgressFn | None) -> None:
    args = {
        "source": str(source.path), "output": str(output), "ftype": qt.ftype, "threads": opts.threads,
        "allow_requantize": opts.allow_requantize, "leave_output_tensor": opts.leave_output_tensor, "pure": opts.pure,
        "output_tensor_type": ggml_type_id(opts.output_tensor_type) if opts.output_tensor_type else None,
        "token_embedding_type": ggml_type_id(opts.token_embedding_type) if opts.token_embedding_type else None,
        "imatrix": str(opts.imatrix) if opts.imatrix else None,
    }
    proc = subprocess.Popen([sys.executable, "-m", "tallow.quantize.worker", json.dumps(args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    error = None
    assert proc.stdout is not None and proc.stderr is not None  # both are pipes
    try:
        for line in proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if "error" in msg:
                error = msg["error"]
            elif on_progress:
                on_progress(msg["done"], msg["total"], msg["tensor"])
        rc = proc.wait()
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    if rc != 0:
        detail = error or (proc.stderr.read().strip().splitlines() or [""])[-1]
        how = f"signal {-rc}" if rc < 0 else f"code {rc}"
        if not detail and rc < 0:
            detail = "llama.cpp aborted"
        raise QuantizeError(f"quantization failed ({how}): {detail}".rstrip(": "),
                            "check free disk space and the source model; nothing was stored")
