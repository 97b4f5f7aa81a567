"""Images, audio and video in API requests: content parts of each API read into decoded Media
(runtime/media/__init__.py), each standing at a media marker where the part was (a video's
frames at one each, with its time). `data:` URIs and base64 are taken; an
http(s) URL only through a fetcher the server was given (serve --allow-media-urls,
serve/media_fetch.py), and is refused by name otherwise."""

from __future__ import annotations

import base64
import binascii
from typing import Any, Callable

from tallow.runtime.media import MediaError, decode_image
from tallow.wire.fields import APIError

# (url, where, param) -> the bytes at the URL, or an APIError
Fetch = Callable[[str, str, str], bytes]


def _bytes(data: Any, where: str, param: str) -> bytes:
    if not isinstance(data, str) or not data:
        raise APIError(f"{where} must be a base64 string", param=param)
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise APIError(f"{where} is not valid base64", param=param) from None


def from_base64(data: Any, where: str, param: str):
    return _decoded(_bytes(data, where, param), where, param)


def _decoded(raw: bytes, where: str, param: str):
    try:
        return decode_image(raw, where)
    except MediaError as exc:
        raise APIError(exc.message, param=param) from None


def from_url(url: Any, where: str, param: str, fetch: Fetch | None = None):
    """A `data:image/...;base64,...` URI's image, or an http(s) URL's through `fetch`."""
    return _decoded(_url_bytes(url, where, param, fetch), where, param)


def _url_bytes(url: Any, where: str, param: str, fetch: Fetch | None, noun: str = "image") -> bytes:
    """The bytes a data: URI holds, or an http(s) URL's through `fetch` (None: refused)."""
    if not isinstance(url, str):
        raise APIError(f"{where} must be a string URL", param=param)
    if url.startswith(("http://", "https://")):
        if fetch is None:
            raise APIError(f"{where}: this server fetches no URL (start it with --allow-media-urls); "
                           f"send the {noun} as a data: URI", param=param)
        return fetch(url, where, param)
    head, comma, data = url.partition(",")
    if not url.startswith("data:"):
        raise APIError(f"{where}: only data: and http(s) URLs are taken", param=param)
    if not comma or not head.endswith(";base64"):
        raise APIError(f"{where}: a data: URI must be base64 (data:{'video/mp4' if noun == 'video' else 'image/png'}"
                       ";base64,...)", param=param)
    return _bytes(data, where, param)


def reader(read: Callable[..., Any], fetch: Fetch | None) -> Callable[[dict, str, str], Any]:
    """A media reader for fields.joined_text, fetching URLs through `fetch` (None: refused)."""
    return lambda part, where, param: read(part, where, param, fetch)


def openai_part(part: dict, where: str, param: str, fetch: Fetch | None = None):
    """Chat Completions' image_url part (Responses' input_image too); None for other kinds."""
    kind = part.get("type")
    if kind == "image_url":
        ref = part.get("image_url")
        url = ref.get("url") if isinstance(ref, dict) else ref
        _check_detail(ref.get("detail") if isinstance(ref, dict) else None, f"{where}.image_url.detail", param)
        return from_url(url, f"{where}.image_url.url", param, fetch)
    if kind == "input_image":
        if part.get("file_id") is not None:
            raise APIError(f"{where}.file_id: files are not supported; send image_url as a data: URI", param=param)
        _check_detail(part.get("detail"), f"{where}.detail", param)
        return from_url(part.get("image_url"), f"{where}.image_url", param, fetch)
    if kind == "input_audio":
        return _input_audio(part.get("input_audio"), f"{where}.input_audio", param)
    if kind == "video_url":  # vLLM's form: {"video_url": {"url": ..., "fps": ...}}
        ref = part.get("video_url")
        holder = ref if isinstance(ref, dict) else {}
        return _video(holder.get("url") if holder else ref, holder, f"{where}.video_url", ".url" if holder else "", param,
                      fetch)
    if kind == "input_video":  # as Responses' input_image: {"video_url": ..., "fps": ...}
        return _video(part.get("video_url"), part, where, ".video_url", param, fetch)
    return None


def _video(url: Any, holder: dict, where: str, at: str, param: str, fetch: Fetch | None) -> list:
    """A video part's frames (runtime/media/video.py), at its `fps` a second (1 if not given);
    `at`: where the URL is within `where`."""
    from tallow.runtime.media.video import decode_video

    fps = holder.get("fps", 1.0)
    if isinstance(fps, bool) or not isinstance(fps, (int, float)) or not 0 < fps <= 30:
        raise APIError(f"{where}.fps must be a number above 0 and at most 30, not {fps!r}", param=param)
    raw = _url_bytes(url, where + at, param, fetch, "video")
    try:
        return decode_video(raw, where + at, float(fps))[0]
    except MediaError as exc:
        raise APIError(exc.message, param=param) from None


def _input_audio(audio: Any, where: str, param: str):
    """Chat Completions' input_audio: base64 data in a format tallow reads (WAV; MP3, FLAC,
    Ogg, M4A and WebM with the speech extra's PyAV)."""
    from tallow.runtime.media.audio import FORMATS, decode_audio

    if not isinstance(audio, dict):
        raise APIError(f"{where} must be an object with data and format", param=param)
    if audio.get("format") not in FORMATS:
        raise APIError(f"{where}.format {audio.get('format')!r} is not supported: send one of {', '.join(FORMATS)}",
                       param=param)
    raw = _bytes(audio.get("data"), f"{where}.data", param)
    try:
        return decode_audio(raw, f"{where}.data")
    except MediaError as exc:
        raise APIError(exc.message, param=param) from None


def _check_detail(detail: Any, where: str, param: str) -> None:
    """The projector decides an image's resolution: "auto" is all tallow can honour."""
    if detail not in (None, "auto"):
        raise APIError(f"{where} {detail!r} is not supported: the projector sees every image at its own "
                       "resolution (use auto)", param=param)


def anthropic_block(block: dict, where: str, param: str, fetch: Fetch | None = None):
    """Messages' image block (a base64 or url source); None for other kinds."""
    if block.get("type") != "image":
        return None
    source = block.get("source")
    if not isinstance(source, dict):
        raise APIError(f"{where}.source must be an object", param=param)
    kind = source.get("type")
    if kind == "url":
        url = source.get("url")
        if not (isinstance(url, str) and url.startswith(("http://", "https://"))):
            raise APIError(f"{where}.source.url must be an http(s) URL", param=param)
        return from_url(url, f"{where}.source.url", param, fetch)
    if kind != "base64":
        raise APIError(f"{where}.source: only base64 and url images are taken, not {kind!r}", param=param)
    return from_base64(source.get("data"), f"{where}.source.data", param)


def ollama_images(images: Any, text: str, where: str) -> dict:
    """Ollama's `images` (base64 strings) as a message's media, placed before its text."""
    from tallow.runtime.media import with_markers

    if not isinstance(images, list):
        raise APIError(f"{where} must be a list of base64 strings", param="messages")
    media = [from_base64(b, f"{where}[{j}]", "messages") for j, b in enumerate(images)]
    if not media:
        return {}
    try:
        return {"content": with_markers(text, media), "media": media}
    except MediaError as exc:
        raise APIError(exc.message, param="messages") from None
