"""Writes small video clips with PyAV: each second one solid colour, so that the colour
projector of tests/helpers/projector.py says what each frame shows."""

from __future__ import annotations

from pathlib import Path


def write_clip(path: Path, colours: list[tuple[int, int, int]], seconds_each: float = 1.0, rate: int = 5,
               size: int = 28, codec: str = "mpeg4") -> Path:
    """A clip of `colours` in turn, each `seconds_each` long, at `rate` frames a second."""
    import av
    import numpy as np

    with av.open(str(path), "w") as out:
        stream = out.add_stream(codec, rate=rate)
        stream.width = stream.height = size
        stream.pix_fmt = "yuv420p"
        for rgb in colours:
            frame = av.VideoFrame.from_ndarray(np.full((size, size, 3), rgb, np.uint8), format="rgb24")
            for _ in range(round(seconds_each * rate)):
                for packet in stream.encode(frame):
                    out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return path
