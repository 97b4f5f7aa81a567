"""Runs llama_model_quantize in a child process and reports progress on stdout.

llama.cpp aborts the whole process on some errors, so the quantization runs here, apart
from the CLI: a crash, Ctrl-C or a full disk then costs only this process, and the parent
removes the partial output. Progress comes from llama.cpp's own "[ i/ n] name" log lines,
captured through the log callback.

    python -m tallow.quantize.worker JSON_ARGUMENTS
"""

from __future__ import annotations

import ctypes
import json
import re
import sys

_PROGRESS = re.compile(r"\[\s*(\d+)/\s*(\d+)\]\s+(\S+)")
_QUANT_SIZE = re.compile(r"quant size\s*=\s*([\d.]+) MiB \(([\d.]+) BPW\)")
_SIZES: list[tuple[float, float]] = []  # (MiB, bits per weight) of each "quant size" llama.cpp logs


def main() -> int:
    import llama_cpp.llama_cpp as C

    args = json.loads(sys.argv[1])
    out = sys.stdout
    errors: list[str] = []

    @C.llama_log_callback
    def log(level, text, user_data):
        line = (text or b"").decode("utf-8", "replace")
        m = _PROGRESS.search(line)
        size = _QUANT_SIZE.search(line)
        if size:
            _SIZES.append((float(size.group(1)), float(size.group(2))))
        elif args.get("sizes"):
            pass  # a dry run reports sizes only
        elif m:
            out.write(json.dumps({"done": int(m.group(1)), "total": int(m.group(2)), "tensor": m.group(3)}) + "\n")
            out.flush()
        elif level == 3 or "error" in line.lower() or "failed" in line.lower():
            errors.append(line.strip())

    C.llama_log_set(log, ctypes.c_void_p(0))
    C.llama_backend_init()
    if args.get("sizes"):
        return dry_runs(C, args)
    params = C.llama_model_quantize_default_params()
    params.nthread = args["threads"]
    params.ftype = args["ftype"]
    params.allow_requantize = args["allow_requantize"]
    params.quantize_output_tensor = not args["leave_output_tensor"]
    params.pure = args["pure"]
    if args.get("output_tensor_type") is not None:
        params.output_tensor_type = args["output_tensor_type"]
    if args.get("token_embedding_type") is not None:
        params.token_embedding_type = args["token_embedding_type"]
    keep = []  # the imatrix arrays must outlive the call
    if args.get("imatrix"):
        from .imatrix import read_imatrix

        entries = read_imatrix(args["imatrix"])
        arr = (C.llama_model_imatrix_data * (len(entries) + 1))()
        for i, (name, values) in enumerate(entries.items()):
            data = (ctypes.c_float * len(values))(*values)
            keep += [name.encode(), data]
            arr[i].name, arr[i].data, arr[i].size = keep[-2], ctypes.cast(data, ctypes.POINTER(ctypes.c_float)), len(values)
        params.imatrix = ctypes.cast(arr, ctypes.POINTER(C.llama_model_imatrix_data))
        keep.append(arr)
    rc = C.llama_model_quantize(args["source"].encode(), args["output"].encode(), ctypes.byref(params))
    if rc != 0:
        out.write(json.dumps({"error": errors[-1] if errors else f"llama_model_quantize returned {rc}"}) + "\n")
        out.flush()
        return 1
    return 0


def dry_runs(C, args) -> int:
    """The size each file type would give this model, from llama.cpp's dry run (it plans
    every tensor's type as a real run would, and writes nothing): one line per type."""
    for ftype in args["sizes"]:
        params = C.llama_model_quantize_default_params()
        params.ftype, params.allow_requantize, params.dry_run = ftype, True, True
        before = len(_SIZES)
        rc = C.llama_model_quantize(args["source"].encode(), args["output"].encode(), ctypes.byref(params))
        found = _SIZES[before:] if rc == 0 else []
        mib, bpw = found[-1] if found else (None, None)
        sys.stdout.write(json.dumps({"ftype": ftype, "bytes": int(mib * (1 << 20)) if mib else None, "bpw": bpw}) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
