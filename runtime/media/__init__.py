"""Media in a prompt: images decoded under limits, before anything reaches libmtmd.

Image decoding is a security boundary. Pillow decodes (not libmtmd's bundled stb_image, which
has no pixel limit and no EXIF handling); the pixel count is checked from the header before
any pixel is decoded, the byte count before that. What reaches the projector is always
8-bit RGB: EXIF orientation applied, CMYK, palette, grey, 16-bit and alpha converted (alpha
composited on white), an animated image's first frame. A media item is named by a hash of
what was decoded, so the same picture reuses its KV cells and disk cache entries whatever
file or encoding it came in (docs/DESIGN.md, "Media").
"""

from __future__ import annotations

import hashlib
import io
import re
from dataclasses import dataclass

from tallow.runtime.errors import TallowError

MARKER = "<__media__>"  # where a media item sits in rendered prompt text (libmtmd's marker)
MAX_BYTES = 20 * 1024 * 1024
MAX_PIXELS = 32_000_000


class MediaError(TallowError):
    """Media that cannot be used: unreadable, too large, or for a model without a projector."""


@dataclass(frozen=True)
class Media:
    """Decoded media: an image's RGB bytes (width x height x 3), or audio's float32 mono
    samples (width of them, height 1, at `rate` a second: runtime/media/audio.py); `key` is a hash
    of them. `label` is what the model reads before it: a video frame's time
    (runtime/media/video.py)."""
    kind: str
    key: str
    data: bytes
    width: int
    height: int
    rate: int = 0
    label: str = ""


def decode_image(raw: bytes, name: str = "the image", max_bytes: int = MAX_BYTES,
                 max_pixels: int = MAX_PIXELS) -> Media:
    """An image file's bytes as 8-bit RGB, or a MediaError saying in one line what is wrong."""
    import warnings

    from PIL import Image, ImageOps, UnidentifiedImageError

    if not raw:
        raise MediaError(f"{name} is empty")
    if len(raw) > max_bytes:
        raise MediaError(f"{name} is {len(raw):,} bytes, more than the limit of {max_bytes:,}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(raw))
            w, h = image.size
            if w <= 0 or h <= 0:
                raise MediaError(f"{name} has no pixels ({w}x{h})")
            if w * h > max_pixels:
                raise MediaError(f"{name} is {w}x{h}: more pixels than the limit of {max_pixels:,}")
            image.load()  # the first frame only, for an animated image
            rgb = _as_rgb(ImageOps.exif_transpose(image))
    except MediaError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise MediaError(f"{name} has more pixels than the limit of {max_pixels:,}") from None
    except UnidentifiedImageError:
        raise MediaError(f"{name} is not an image tallow can read", "give a PNG, JPEG, GIF, WebP or BMP") from None
    except (OSError, ValueError, SyntaxError) as e:
        raise MediaError(f"{name} is truncated or damaged ({e})") from None
    data = rgb.tobytes()
    key = hashlib.sha256(b"%dx%d:" % rgb.size + data).hexdigest()[:32]
    return Media("image", key, data, rgb.size[0], rgb.size[1])


def _as_rgb(image):
    """Any Pillow mode as 8-bit RGB: alpha over white, 16-bit and float scaled to 8 bits."""
    from PIL import Image

    if image.mode in ("I;16", "I;16B", "I;16L", "I", "F"):
        import numpy as np

        values = np.asarray(image, dtype=np.float64)
        top = 65535.0 if image.mode.startswith("I;16") or values.max(initial=0) > 255 else 255.0
        image = Image.fromarray((np.clip(values / top, 0, 1) * 255).astype("uint8"), "L")
    if image.mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")
    if image.mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        image = image.convert("RGBA")
        white = Image.new("RGBA", image.size, (255, 255, 255, 255))
        image = Image.alpha_composite(white, image)
    return image.convert("RGB")


def media_noun(kinds: set[str]) -> str:
    """What media of these kinds are, in a message: images, audio, or images and audio."""
    return "images and audio" if len(kinds) > 1 else "audio" if kinds == {"audio"} else "images"


def missing_encoder(kinds: set[str], vision: bool, audio: bool) -> tuple[str, str] | None:
    """(the encoder, what it would take) of the first kind a projector with these encoders
    cannot take; None when it takes them all."""
    for kind, encoder, has in (("audio", "audio", audio), ("image", "vision", vision)):
        if kind in kinds and not has:
            return encoder, media_noun({kind})
    return None


def marker(media: Media) -> str:
    """Where one media item stands in a message's text: libmtmd's marker, after its label."""
    return f"{media.label} {MARKER}\n" if media.label else MARKER + "\n"


def with_markers(text: str, media: list[Media]) -> str:
    """A message's text with its media placed before it (as llama-mtmd-cli places them)."""
    if MARKER in text:
        raise MediaError(f"the prompt contains libmtmd's media marker {MARKER} as text")
    return "".join(marker(m) for m in media) + text


# A media item's marker in a message, with the label a frame has (runtime/media/video.py).
MARKED = re.compile(r"(?:\[frame at [0-9:.]+\] )?" + re.escape(MARKER) + "\n?")


def stored(messages: list[dict]) -> list[dict]:
    """Messages as JSON can hold them: each image as a lossless PNG in base64 (a stored
    conversation continued later gives the model the same pixels, so the same media key)."""
    return [{**m, "media": [_png(x) for x in m["media"]]} if m.get("media") else m for m in messages]


def restored(messages: list[dict]) -> list[dict]:
    """`stored` undone: the images decoded again, under the usual limits."""
    import base64
    from dataclasses import replace

    return [{**m, "media": [replace(decode_image(base64.b64decode(x["png"]), "a stored image"), label=x.get("label", ""))
                            for x in m["media"]]}
            if m.get("media") else m for m in messages]


def _png(media: Media) -> dict:
    import base64

    from PIL import Image

    out = io.BytesIO()
    Image.frombytes("RGB", (media.width, media.height), media.data).save(out, "PNG")
    return {"kind": media.kind, "png": base64.b64encode(out.getvalue()).decode("ascii"), "label": media.label}


def without_media(message: dict) -> dict:
    """A message as text alone (what a saved conversation keeps): its media and markers dropped."""
    if not message.get("media"):
        return message
    text = MARKED.sub("", message["content"])
    return {k: v for k, v in message.items() if k != "media"} | {"content": text}
