"""Runs llama_model_quantize in a child process and reports progress on stdout.

llama.cpp aborts the whole process on some errors, so the quantization runs here, apart
from the CLI: a crash, Ctrl-C or a full disk then costs only this process, and the parent
removes the partial output. Progress comes from llama.cpp's own "[ i/ n] name" log lines,
captured through the log callback.

    python -m tallow.quantize.worker JSON_ARGUMENTS
"""

from __future__ import annotations

import json
import re
import sys

_PROGRESS = re.compile(r"\[\s*(\d+)/\s*(\d+)\]\s+(\S+)")
_QUANT_SIZE = re.compile(r"quant size\s*=\s*([\d.]+) MiB \(([\d.]+) BPW\)")
_SIZES: list[tuple[float, float]] = []  # (MiB, bits per weight) of each "quant size" llama.cpp logs


def main() -> int:
    from tallow.runtime import backend

    args = json.loads(sys.argv[1])
    out = sys.stdout
    errors: list[str] = []

    def log(level: int, line: str) -> None:
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

    backend.listen_to_logs(log)
    if args.get("sizes"):
        return dry_runs(backend, args)
    imatrix = None
    if args.get("imatrix"):
        from tallow.quantize.imatrix import read_imatrix

        imatrix = read_imatrix(args["imatrix"])
    rc = backend.quantize(args["source"], args["output"], args["ftype"], threads=args["threads"],
                          allow_requantize=args["allow_requantize"], leave_output_tensor=args["leave_output_tensor"],
                          pure=args["pure"], output_tensor_type=args.get("output_tensor_type"),
                          token_embedding_type=args.get("token_embedding_type"), imatrix=imatrix)
    if rc != 0:
        out.write(json.dumps({"error": errors[-1] if errors else f"llama_model_quantize returned {rc}"}) + "\n")
        out.flush()
        return 1
    return 0


def dry_runs(backend, args) -> int:
    """The size each file type would give this model, from llama.cpp's dry run (it plans
    every tensor's type as a real run would, and writes nothing): one line per type."""
    for ftype in args["sizes"]:
        before = len(_SIZES)
        rc = backend.quantize(args["source"], args["output"], ftype, allow_requantize=True, dry_run=True)
        found = _SIZES[before:] if rc == 0 else []
        mib, bpw = found[-1] if found else (None, None)
        sys.stdout.write(json.dumps({"ftype": ftype, "bytes": int(mib * (1 << 20)) if mib else None, "bpw": bpw}) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
