"""Images through tallow against llama.cpp's own llama-mtmd-cli, built from the same vendored
llama.cpp: the default model, the same projector (tests/helpers/projector.py's benchmark one:
a ViT-B/14 at 224 pixels, 256 image tokens, random weights) and the same pictures, 2 threads,
flash attention on and weight repacking off on both (llama.cpp's AMX kernels crash on some
CPUs), in paired, alternating rounds (tests/benchmarks/paired.py), a new picture each round.

    python tests/benchmarks/vision.py [--rounds 5] [--mtmd-cli PATH]

Judged: the image encode time and TTFT, tallow / the native tool (<= 1/0.97x: >= 0.97x its
speed); reported and held to their targets: tallow's TTFT for a second question about the
same picture (<= 0.2x the first), and in `tallow serve`, four text streams' p95 inter-token
latency while another request's picture is encoded, against their p95 without it (<= 2x).
Exits 1 when a target is missed, 3 when the machine was too noisy to say.
"""

from __future__ import annotations

import argparse
import base64
import io
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

THREADS, CTX = 2, 2048
QUESTION = "Describe this picture in one sentence."


def picture(seed: int) -> bytes:
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (224, 224, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(out, "PNG")
    return out.getvalue()


def native_round(cli: Path, model: Path, proj: Path, image: Path) -> tuple[float, float]:
    """(encode ms, TTFT ms) of llama-mtmd-cli for one picture: its own log of the encode, and
    the time from its "encoding" log line to its first output on stdout (the newline it
    prints once the prompt is evaluated, just before it samples), both read as they arrive;
    the few template tokens it evaluates before the picture are left out, in its favour."""
    proc = subprocess.Popen([str(cli), "-m", str(model), "--mmproj", str(proj), "--image", str(image), "-p", QUESTION,
                             "-n", "1", "--temp", "0", "-t", str(THREADS), "-c", str(CTX), "--no-warmup", "--no-repack",
                             "-fa", "on"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    log: list[tuple[float, str]] = []
    first: list[float] = []

    def read_log() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            log.append((time.perf_counter(), line.decode("utf-8", "replace")))

    reader = threading.Thread(target=read_log)
    reader.start()
    assert proc.stdout is not None
    while proc.stdout.read1(4096):
        if not first:
            first.append(time.perf_counter())
    proc.wait(timeout=600)
    reader.join()
    start = next((t for t, line in log if "encoding mtmd batch" in line), None)
    done = next((re.search(r"encoding done in (\d+) ms", line) for _, line in log if "encoding done in" in line), None)
    if proc.returncode != 0 or start is None or done is None or not first:
        raise RuntimeError(f"llama-mtmd-cli failed ({proc.returncode}): {''.join(line for _, line in log)[-600:]}")
    return float(done.group(1)), (first[0] - start) * 1000


def tallow_round(engine, image) -> tuple[float, float, float]:
    """(encode ms, TTFT ms, TTFT ms of a second question about the same picture)."""
    from tallow.runtime.media import with_markers
    from tallow.runtime.types import Sampling

    engine.reset()
    first = [{"role": "user", "content": with_markers(QUESTION, [image]), "media": [image]}]
    *_, a = engine.stream(engine.request(first, sampling=Sampling(temperature=0.0), max_tokens=1))
    second = first + [{"role": "assistant", "content": "A picture."}, {"role": "user", "content": "What else?"}]
    *_, b = engine.stream(engine.request(second, sampling=Sampling(temperature=0.0), max_tokens=1))
    return a.timings.media_ms, a.timings.ttft_ms, b.timings.ttft_ms


def itl_during_encode(home: Path, model: str, proj: Path) -> tuple[float, float]:
    """Four text streams in `tallow serve`: their p95 inter-token gap in the second before a
    picture request arrives, and while its picture is encoded (until its first token)."""
    from helpers.server import Server

    server = Server(model, home, "--parallel", "5", "--mmproj", str(proj), "--ctx", str(5 * CTX), "--no-cache",
                    env={"TALLOW_CPU_REPACK": "off"})
    arrivals: list[list[float]] = [[] for _ in range(4)]
    try:
        client = server.client()

        def stream(i: int) -> None:
            s = client.chat.completions.create(model=model, max_tokens=400, temperature=0.8, seed=i, stream=True,
                                               messages=[{"role": "user", "content": f"Tell story number {i}."}])
            for chunk in s:
                if chunk.choices and chunk.choices[0].delta.content:
                    arrivals[i].append(time.perf_counter())

        threads = [threading.Thread(target=stream, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        time.sleep(3.0)  # all four decoding
        sent = time.perf_counter()
        uri = "data:image/png;base64," + base64.b64encode(picture(99)).decode()
        s = client.chat.completions.create(model=model, max_tokens=1, stream=True, messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": uri}}, {"type": "text", "text": QUESTION}]}])
        first = None
        for _ in s:
            first = first or time.perf_counter()
        for t in threads:
            t.join()
    finally:
        server.close()

    def p95(lo: float, hi: float) -> float:
        gaps = [b - a for times in arrivals for a, b in zip(times, times[1:]) if lo <= b <= hi]
        gaps.sort()
        return gaps[min(len(gaps) - 1, int(0.95 * len(gaps)))] * 1000 if gaps else float("nan")

    assert first is not None
    return p95(sent - 1.0, sent), p95(sent, first)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--mtmd-cli", default=None)
    args = ap.parse_args()
    from helpers.processes import shared_home
    from helpers.projector import write_bench_projector

    from benchmarks.llamabench import llama_tool
    from benchmarks.paired import Comparison, compare_many, exit_code
    from tallow.models.resolve import locate
    from tallow.models.store import Store
    from tallow.runtime.engine import Engine
    from tallow.runtime.media import decode_image
    from tallow.runtime.types import LoadSettings

    home = shared_home()
    model = locate("smollm2:135m", Store(home / "models")).path
    cli = llama_tool("llama-mtmd-cli", args.mtmd_cli)
    with tempfile.TemporaryDirectory() as tmp:
        proj = write_bench_projector(Path(tmp) / "bench-mmproj.gguf", model)
        files = []
        for r in range(args.rounds):
            files.append(Path(tmp) / f"p{r}.png")
            files[-1].write_bytes(picture(r))
        no_repack = SimpleNamespace(repack=False)  # the one verdict of a machine profile a load reads here
        settings = LoadSettings(n_ctx=CTX, n_threads=THREADS, mmproj=proj, flash_attn="on", machine=no_repack)
        agains: list[float] = []
        numbered = iter(range(1_000_000))

        def measure(arm: str) -> tuple[float, float]:
            f = Path(tmp) / f"p{next(numbered)}.png"
            f.write_bytes(picture(int(f.stem[1:])))
            if arm == "reference":
                return native_round(cli, model, proj, f)
            encode, ttft, again = tallow_round(engine, decode_image(f.read_bytes()))
            agains.append(again / ttft)
            return encode, ttft

        with Engine(model, settings) as engine:
            verdicts = compare_many(Comparison("image encode, tallow / llama-mtmd-cli", measure, 1 / 0.97, True,
                                               args.rounds, unit=" ms"),
                                    [Comparison("TTFT, tallow / llama-mtmd-cli", lambda arm: 0.0, 1 / 0.97, True)])
        quiet, busy = itl_during_encode(home, "smollm2:135m", proj)
    again = statistics.median(agains)
    print(f"second question about the same picture: TTFT {again:.3f}x the first (target <= 0.2)")
    print(f"serve, 4 text streams: p95 ITL {quiet:.1f} ms before, {busy:.1f} ms during another request's encode: "
          f"{busy / quiet:.2f}x (target <= 2)")
    return exit_code(verdicts) or (0 if again <= 0.2 and busy / quiet <= 2 else 1)

if __name__ == "__main__":
    sys.exit(main())
