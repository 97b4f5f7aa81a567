"""Video in a prompt: frames sampled from a clip, each shown to the projector as an image with
its time before it, and thinned to fit the context.

PyAV (FFmpeg; the video and speech extras) decodes, under the limits images have and a few
of its own: the bytes, the duration, each frame's pixels (from the stream's header, before a
frame is decoded) and the frames decoded in all, so neither a corrupt file nor a container
that claims ten hours can take unbounded time or memory. Frames are taken at `fps` a second
(spread evenly over the clip when that would exceed MAX_FRAMES), shrunk so their longer side
is at most FRAME_SIDE (a projector resizes to less), and each becomes an image Media whose key
is a hash of its pixels: a second question about the same clip finds its frames' cells
already evaluated, as for pictures (docs/DESIGN.md, "Media").
"""

from __future__ import annotations

import hashlib
import io
from typing import Any, Callable

from tallow.runtime.media import MARKED, MAX_PIXELS, Media, MediaError

MAX_BYTES = 200 * 1024 * 1024
MAX_SECONDS = 3 * 3600
MAX_FRAMES = 128  # taken from one clip; more than any context holds at a projector's cells per frame
MAX_DECODED = 100_000  # frames decoded in all, whatever the file claims
FRAME_SIDE = 768
FORMATS = ("mp4", "webm", "mkv", "mov", "avi", "gif")  # what an API's video part may name


def decode_video(raw: bytes, name: str = "the video", fps: float = 1.0,
                 max_bytes: int = MAX_BYTES) -> tuple[list[Media], str | None]:
    """A clip's frames at `fps` a second as labelled images, and a note when fewer were taken
    (a long clip); a one-line MediaError for anything unreadable or out of bounds."""
    if not raw:
        raise MediaError(f"{name} is empty")
    if len(raw) > max_bytes:
        raise MediaError(f"{name} is {len(raw):,} bytes, more than the limit of {max_bytes:,}")
    if not 0 < fps <= 30:
        raise MediaError(f"a video's frame rate must be above 0 and at most 30 a second, not {fps:g}")
    try:
        import av
    except ImportError:
        raise MediaError(f"reading {name} needs PyAV", 'pip install "tallow[video]"') from None
    try:
        with av.open(io.BytesIO(raw), mode="r") as container:
            return _frames(container, name, fps)
    except MediaError:
        raise
    except (av.error.FFmpegError, OSError, ValueError, EOFError) as exc:
        raise MediaError(f"{name} is not a video tallow can read, or is damaged ({_reason(exc)})") from None


def _reason(exc: Exception) -> str:
    return str(getattr(exc, "strerror", None) or exc).strip() or type(exc).__name__


def _frames(container: Any, name: str, fps: float) -> tuple[list[Media], str | None]:
    if not container.streams.video:
        raise MediaError(f"{name} has no video stream")
    stream = container.streams.video[0]
    width, height = stream.codec_context.width, stream.codec_context.height
    if width <= 0 or height <= 0 or width * height > MAX_PIXELS:
        raise MediaError(f"{name}'s frames are {width}x{height}: outside 1 to {MAX_PIXELS:,} pixels")
    duration = _duration(container, stream)
    if duration > MAX_SECONDS:
        raise MediaError(f"{name} is {duration / 3600:.1f} hours long, more than the {MAX_SECONDS // 3600} taken")
    spread = duration * fps > MAX_FRAMES
    step, note = duration / MAX_FRAMES if spread else 1.0 / fps, None
    stream.thread_type = "AUTO"
    frames: list[Media] = []
    due = 0.0
    for decoded, frame in enumerate(container.decode(stream)):
        if decoded >= MAX_DECODED:
            raise MediaError(f"{name} holds more than {MAX_DECODED:,} frames")
        t = float(frame.time) if frame.time is not None else decoded * step
        if t + 1e-6 < due:
            continue
        frames.append(_image(frame, t))
        if len(frames) == MAX_FRAMES:
            note = note or f"{name}: only its first {MAX_FRAMES} frames were taken (its length is not declared)"
            break
        while due <= t + 1e-6:  # the next frame is the first at or after the next step
            due += step
    if not frames:
        raise MediaError(f"{name} holds no frame")
    if spread:
        note = (f"{name} is {duration:.0f} s long: {len(frames)} frames taken, one each {step:.1f} s at most "
                f"(not {fps:g} a second)")
    return frames, note


def _duration(container: Any, stream: Any) -> float:
    """The clip's declared length in seconds (0 when it declares none)."""
    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    return container.duration / 1_000_000 if container.duration else 0.0


def _image(frame: Any, t: float) -> Media:
    """A decoded frame as an RGB image no larger than FRAME_SIDE, labelled with its time."""
    scale = min(1.0, FRAME_SIDE / max(frame.width, frame.height))
    w, h = max(1, round(frame.width * scale)), max(1, round(frame.height * scale))
    rgb = frame.reformat(width=w, height=h, format="rgb24").to_ndarray()
    data = rgb.tobytes()
    key = hashlib.sha256(b"%dx%d:" % (w, h) + data).hexdigest()[:32]
    return Media("image", key, data, w, h, label=f"[frame at {clock(t)}]")


def clock(seconds: float) -> str:
    """A time in a clip as people write it: 0:05, 0:05.5, 1:02:05."""
    tenths = round(seconds * 10)
    s, tenth = divmod(tenths, 10)
    whole = f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"
    return f"{whole}.{tenth}" if tenth else whole


def fit_frames(messages: list[dict], spans: tuple, room: int, count: Callable[[str], int]) -> tuple[list[dict], str] | None:
    """The messages with their video frames thinned, evenly over each clip's time, so that all
    of them (their labels too) take at most `room` cells; and a note saying so. None when they
    fit already (or there are no frames). `spans`: the prompt's media spans
    (runtime/media/spans.py); `count`: a text's tokens."""
    media = [m for msg in messages for m in msg.get("media") or ()]
    frames = [i for i, m in enumerate(media) if m.label]
    images = sum(m.kind == "image" for m in media)
    if not frames or not images:
        return None
    per_frame = max(1, sum(s.n for s in spans if s.kind == "image") // images) + count(media[frames[-1]].label + " ")
    if per_frame * len(frames) <= room:
        return None
    keep = max(1, room // per_frame)
    kept = {frames[round(k * (len(frames) - 1) / (keep - 1))] for k in range(keep)} if keep > 1 else {frames[0]}
    dropped = set(frames) - kept
    out, index = [], 0
    for msg in messages:
        items = msg.get("media") or []
        if items:
            msg = _without(msg, {j for j in range(len(items)) if index + j in dropped})
        index += len(items)
        out.append(msg)
    return out, (f"{len(frames)} video frames would take {per_frame * len(frames):,} cells, more than half the "
                 f"context: {len(kept)} kept, spread evenly (lower the frame rate, or give a longer context)")


def _without(message: dict, drop: set[int]) -> dict:
    """A message with its media items at `drop` (and their markers and labels) taken out."""
    if not drop:
        return message
    count = iter(range(len(message["media"])))
    text = MARKED.sub(lambda m: "" if next(count) in drop else m.group(0), message["content"])
    media = [m for j, m in enumerate(message["media"]) if j not in drop]
    return {**message, "content": text, "media": media}
