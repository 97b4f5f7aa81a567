"""tallow transcribe against faster-whisper's own transcribe call, and its memory on long audio.

1. Speed: one minute of espeak-ng speech (a dozen sentences), recognised by tallow's
   `listen.transcribe` (decoding with PyAV, windows, segments) and by faster-whisper's
   `WhisperModel.transcribe` on the same file with the same settings (int8, the same
   threads, beam 5, its voice detector on), each model loaded once, in paired, alternating
   rounds (tests/benchmarks/paired.py). Target: tallow's time <= 1/0.97 of faster-whisper's
   (>= 0.97x its speed), and the same text. The real-time factor is printed.
2. Memory: `tallow transcribe` in a fresh process on a 1-minute FLAC and on a 1-hour one
   (the same speech every 5 minutes, silence between), each process's peak RSS from the
   kernel (wait4). Target: the hour's peak <= 1.2x the minute's.

Exits 1 when a target is missed, 3 when the machine was too noisy to say.

    python tests/benchmarks/transcribe.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.paired import Comparison, compare, exit_code  # noqa: E402

SENTENCES = [
    "The committee met on Tuesday to discuss the budget for the coming year.",
    "Three members asked for more money for the library and the public gardens.",
    "The treasurer explained that the roads must be repaired before the winter.",
    "After a long discussion they agreed to meet again in two weeks.",
    "Meanwhile the school will collect ideas from parents and teachers.",
    "A new bus line to the hospital was approved without a vote against it.",
    "The mayor thanked the volunteers who cleaned the river banks in spring.",
    "Next month the town will publish the plan and invite comments from everyone.",
]
RATE = 16_000


def speech(folder: Path) -> np.ndarray:
    """About a minute of espeak-ng speech at 16 kHz."""
    from helpers.speech import samples, spoken

    parts = []
    for i, text in enumerate(SENTENCES * 2):
        clip, rate = samples(spoken(text, folder / f"s{i}.wav"))
        parts += [np.interp(np.arange(0, len(clip), rate / RATE), np.arange(len(clip)), clip).astype(np.float32),
                  np.zeros(RATE // 2, dtype=np.float32)]
    return np.concatenate(parts)


def flac(path: Path, pieces) -> Path:
    """A FLAC file of the float32 blocks `pieces` yields (16 kHz mono), written as they come."""
    import av

    with av.open(str(path), "w") as out:
        stream = out.add_stream("flac", rate=RATE)
        stream.layout = "mono"
        for block in pieces:
            frame = av.AudioFrame.from_ndarray((np.clip(block, -1, 1) * 32767).astype(np.int16)[None, :],
                                               format="s16", layout="mono")
            frame.sample_rate = RATE
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return path


def hour_of(minute: np.ndarray):
    """An hour: the minute of speech at the start of every 5 minutes, silence between."""
    silence = np.zeros(RATE * 10, dtype=np.float32)
    for _ in range(12):
        yield minute
        for _ in range((300 * RATE - len(minute)) // len(silence)):
            yield silence


def peak_rss(args: list[str], env: dict) -> tuple[float, float]:
    """(peak RSS in MB, seconds) of a tallow process."""
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "tallow.cli", *args], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"tallow {' '.join(args)} failed: {proc.stderr.read().decode()[-400:]}")
    return usage.ru_maxrss / 1024, time.perf_counter() - started


def main() -> int:
    from helpers.processes import tallow_env
    from helpers.speech import whisper_folder

    from tallow.runtime.backend.whisper import Whisper
    from tallow.runtime.host.threads import physical_cores
    from tallow.runtime.speech.listen import Ask, transcribe
    from tallow.runtime.speech.transcript import Transcript

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    folder, threads = whisper_folder(), physical_cores()
    with tempfile.TemporaryDirectory() as tmp:
        minute = speech(Path(tmp))
        clip = flac(Path(tmp) / "minute.flac", [minute])
        ours = Whisper(folder, threads)
        from faster_whisper import WhisperModel

        theirs = WhisperModel(str(folder), device="cpu", compute_type="int8", cpu_threads=threads,
                              local_files_only=True)
        texts: dict[str, str] = {}

        def measure(arm: str) -> float:
            started = time.perf_counter()
            if arm == "subject":
                heard = Transcript()
                for _ in transcribe(ours, clip, clip.name, Ask(), heard):
                    pass
                texts[arm] = heard.text
            else:
                segments, _ = theirs.transcribe(str(clip), beam_size=5, vad_filter=True)
                texts[arm] = "".join(s.text for s in segments).strip()
            return time.perf_counter() - started

        speed = compare(Comparison("one minute, tallow against faster-whisper", measure, target=1 / 0.97,
                                   rounds=args.rounds, unit=" s"))
        same = texts["subject"] == texts["reference"]
        seconds = len(minute) / RATE
        print(f"audio {seconds:.1f} s; tallow's real-time factor {np.median(speed.figures['subject']) / seconds:.3f}, "
              f"faster-whisper's {np.median(speed.figures['reference']) / seconds:.3f}; the same text: {same}")
        home = Path(tmp) / "home"
        env = tallow_env(home)
        done = subprocess.run([sys.executable, "-m", "tallow.cli", "import", str(folder), "--name", "whisper:base",
                               "--link"], env=env, capture_output=True)
        if done.returncode != 0:
            sys.exit(done.stderr.decode())
        hour = flac(Path(tmp) / "hour.flac", hour_of(minute))
        small, t_small = peak_rss(["transcribe", str(clip), "-o", str(Path(tmp) / "a")], env)
        large, t_large = peak_rss(["transcribe", str(hour), "-o", str(Path(tmp) / "b")], env)
        ratio = large / small
        print(f"peak RSS: one minute {small:.0f} MB ({t_small:.1f} s), one hour {large:.0f} MB ({t_large:.1f} s): "
              f"{ratio:.2f}x (target <= 1.2x: {'met' if ratio <= 1.2 else 'MISSED'})")
    code = exit_code([speed])
    return 1 if ratio > 1.2 or not same else code


if __name__ == "__main__":
    sys.exit(main())
