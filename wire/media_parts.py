"""Images in API requests: content parts of each API read into decoded Media (runtime/media.py),
each standing at a media marker where the part was. Only `data:` URIs and base64 are taken; a
URL is refused by name (tallow fetches nothing for a request)."""

from __future__ import annotations

import base64
import binascii
from typing import Any

from tallow.runtime.media import MediaError, decode_image
from tallow.wire.fields import APIError


def from_base64(data: Any, where: str, param: str):
    if not isinstance(data, str) or not data:
        raise APIError(f"{where} must be a base64 string", param=param)
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise APIError(f"{where} is not valid base64", param=param) from None
    try:
        return decode_image(raw, where)
    except MediaError as exc:
        raise APIError(exc.message, param=param) from None


def from_url(url: Any, where: str, param: str):
    """A `data:image/...;base64,...` URI's image; any other URL is refused."""
    if not isinstance(url, str):
        raise APIError(f"{where} must be a string URL", param=param)
    head, comma, data = url.partition(",")
    if not url.startswith("data:"):
        raise APIError(f"{where}: only data: URIs are taken (tallow fetches no URL for a request)", param=param)
    if not comma or not head.endswith(";base64"):
        raise APIError(f"{where}: a data: URI must be base64 (data:image/png;base64,...)", param=param)
    return from_base64(data, where, param)


def openai_part(part: dict, where: str, param: str):
    """Chat Completions' image_url part (Responses' input_image too); None for other kinds."""
    kind = part.get("type")
    if kind == "image_url":
        ref = part.get("image_url")
        url = ref.get("url") if isinstance(ref, dict) else ref
        if isinstance(ref, dict) and ref.get("detail") not in (None, "auto", "low", "high"):
            raise APIError(f"{where}.image_url.detail must be auto, low or high", param=param)
        return from_url(url, f"{where}.image_url.url", param)
    if kind == "input_image":
        if part.get("file_id") is not None:
            raise APIError(f"{where}.file_id: files are not supported; send image_url as a data: URI", param=param)
        return from_url(part.get("image_url"), f"{where}.image_url", param)
    return None


def anthropic_block(block: dict, where: str, param: str):
    """Messages' image block (base64 source); None for other kinds."""
    if block.get("type") != "image":
        return None
    source = block.get("source")
    if not isinstance(source, dict) or source.get("type") != "base64":
        kind = source.get("type") if isinstance(source, dict) else None
        raise APIError(f"{where}.source: only base64 images are taken, not {kind!r}", param=param)
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
        return {"content": with_markers(text, len(media)), "media": media}
    except MediaError as exc:
        raise APIError(exc.message, param="messages") from None
