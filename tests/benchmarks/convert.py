"""Converting a ~1 GB safetensors checkpoint: peak memory against the largest tensor.

A random Llama-shaped checkpoint (BF16, 2 shards; hidden 2048, 8 layers, FFN 5632, a
32,000-row embedding: about 540M parameters, 1.1 GB) is written, then converted to an F16
GGUF by tallow's converter in a child process, `--rounds` times. Printed: wall time, the
rate, and the child's peak RSS against the target: the largest tensor (as stored) plus 300
MB. Exit 1 when the target is missed.

llama.cpp's convert_hf_to_gguf.py needs torch, which is not installed here (PyPI's wheels
bring the CUDA libraries), so its time is not measured beside tallow's.

    python tests/benchmarks/convert.py [--rounds 3] [--layers 8]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from helpers.decoder_reference import write_tiny_decoder  # noqa: E402

CHILD = """
import sys
from pathlib import Path
from tallow.models.convert.source import import_source
import_source(Path(sys.argv[1]), Path(sys.argv[2]), "f16")
# this process's own high-water mark (getrusage would count the parent's pages before exec)
print(next(line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM:")))
"""


def largest_tensor(folder: Path) -> int:
    biggest = 0
    for file in folder.glob("*.safetensors"):
        raw = file.read_bytes()[:8]
        with open(file, "rb") as f:
            f.seek(8)
            header = json.loads(f.read(int.from_bytes(raw, "little")))
        biggest = max([biggest] + [v["data_offsets"][1] - v["data_offsets"][0] for k, v in header.items()
                                   if k != "__metadata__"])
    return biggest


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--layers", type=int, default=8)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_tiny_decoder(Path(tmp) / "big", "llama", hidden=2048, layers=args.layers, heads=16, kv_heads=8,
                                    ff=5632, dtype="BF16", shards=2, vocab_size=32000)
        size = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
        target = largest_tensor(folder) + (300 << 20)
        times, peaks = [], []
        for _ in range(args.rounds):
            out = Path(tmp) / "big.gguf"
            started = time.perf_counter()
            done = subprocess.run([sys.executable, "-c", CHILD, str(folder), str(out)], check=True,
                                  capture_output=True, text=True)
            times.append(time.perf_counter() - started)
            peaks.append(int(done.stdout.split()[-1]) * 1024)  # VmHWM is in kB
            out.unlink()
        wall = statistics.median(times)
        peak = max(peaks)
        print(f"checkpoint {size / 1e9:.2f} GB (BF16, 2 shards), largest tensor {largest_tensor(folder) / 1e6:.0f} MB")
        print(f"convert to F16: median {wall:.1f} s over {args.rounds} rounds ({min(times):.1f}-{max(times):.1f}), "
              f"{size / wall / 1e6:.0f} MB/s; load {os.getloadavg()[0]:.2f}")
        state = "OK" if peak <= target else "MISSED"
        print(f"peak RSS {peak / 1e6:.0f} MB, target <= largest tensor + 300 MB = {target / 1e6:.0f} MB: {state}")
        print("llama.cpp's convert_hf_to_gguf.py: not run (it needs torch)")
    return 0 if peak <= target else 1


if __name__ == "__main__":
    sys.exit(main())
