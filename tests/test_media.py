"""Hostile and unusual images through runtime/media.decode_image: a clean MediaError or RGB;
fetching an image URL under limits; choosing a repository's projector."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from tallow.models.errors import ModelNotFound
from tallow.models.hub import HubFile
from tallow.models.projector import choose_projector
from tallow.runtime.media import MediaError, decode_image, restored, stored
from tallow.wire.fields import APIError

REPO = "tallow-test/SmolLM2-Vision-GGUF"


def _save(image: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    image.save(buf, fmt, **kw)
    return buf.getvalue()


def _noise(w: int = 96, h: int = 64) -> Image.Image:
    return Image.fromarray(np.random.default_rng(1).integers(0, 256, (h, w, 3), dtype=np.uint8), "RGB")


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def _bomb(side: int = 30_000) -> bytes:
    """A PNG whose header claims side x side pixels, in a few hundred bytes."""
    header = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)
    rows = zlib.compress(b"\x00" * (side * 3 + 1) * 4)
    return b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", header) + _png_chunk(b"IDAT", rows) + _png_chunk(b"IEND", b"")


@pytest.mark.parametrize("raw,message", [
    (b"", "is empty"),
    (b"GIF89a not really", "truncated or damaged|not an image"),
    (b"%PDF-1.7 wrong magic" * 10, "not an image tallow can read"),
    (_save(_noise(), "PNG")[:1500], "truncated or damaged"),
    (_save(_noise(), "JPEG")[:1500], "truncated or damaged"),
    (_bomb(), "more pixels than the limit"),
])
def test_hostile_images_are_one_line_errors(raw, message):
    with pytest.raises(MediaError, match=message) as e:
        decode_image(raw)
    assert "\n" not in str(e.value)


def test_the_pixel_limit_is_checked_from_the_header():
    with pytest.raises(MediaError, match="96x64: more pixels than the limit of 1,000"):
        decode_image(_save(_noise(), "PNG"), max_pixels=1000)


def test_too_many_bytes_are_refused_before_decoding():
    with pytest.raises(MediaError, match="more than the limit of 1,000"):
        decode_image(_save(_noise(), "PNG"), max_bytes=1000)


def test_an_animated_gif_gives_its_first_frame():
    frames = [Image.new("P", (8, 8), i % 256) for i in range(1000)]
    frames[0] = Image.new("RGB", (8, 8), (255, 0, 0)).quantize()
    raw = _save(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=10)
    media = decode_image(raw)
    assert (media.width, media.height) == (8, 8)
    assert media.data[:3] == bytes((255, 0, 0))


@pytest.mark.parametrize("image,fmt,expect", [
    (Image.new("CMYK", (4, 4), (0, 255, 255, 0)), "JPEG", (255, 0, 0)),  # CMYK red
    (Image.new("RGBA", (4, 4), (0, 0, 255, 0)), "PNG", (255, 255, 255)),  # transparent: white behind
    (Image.new("LA", (4, 4), (0, 255)), "PNG", (0, 0, 0)),
    (Image.fromarray(np.full((4, 4), 65535, np.uint16)), "PNG", (255, 255, 255)),  # 16-bit grey
])
def test_modes_become_8_bit_rgb(image, fmt, expect):
    media = decode_image(_save(image, fmt))
    assert len(media.data) == media.width * media.height * 3
    assert all(abs(a - b) <= 8 for a, b in zip(media.data[:3], expect))


def test_a_palette_image_with_transparency_is_composited():
    image = Image.new("P", (4, 4), 0)
    image.putpalette([0, 0, 0] * 256)
    raw = _save(image, "PNG", transparency=0)
    assert decode_image(raw).data[:3] == b"\xff\xff\xff"


def test_exif_orientation_is_applied():
    image = Image.new("RGB", (20, 10), (0, 255, 0))
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display
    media = decode_image(_save(image, "JPEG", exif=exif))
    assert (media.width, media.height) == (10, 20)


def _hub_files(*paths: str) -> list[HubFile]:
    return [HubFile(p, 1, "0" * 64, None) for p in paths]


def test_the_projector_of_the_weights_precision_else_f16_is_chosen():
    files = _hub_files("m-Q4_K_M.gguf", "m-Q8_0.gguf", "mmproj-F16.gguf", "mmproj-Q8_0.gguf", "mmproj-F32.gguf")
    assert choose_projector(REPO, files, "Q8_0", None).path == "mmproj-Q8_0.gguf"
    assert choose_projector(REPO, files, "Q4_K_M", None).path == "mmproj-F16.gguf"
    assert choose_projector(REPO, files, "Q4_K_M", "f32").path == "mmproj-F32.gguf"
    assert choose_projector(REPO, files, "Q4_K_M", "mmproj-Q8_0.gguf").path == "mmproj-Q8_0.gguf"
    assert choose_projector(REPO, _hub_files("m-Q4_K_M.gguf"), "Q4_K_M", None) is None
    assert choose_projector(REPO, _hub_files("m.gguf", "sub/x-mmproj-bf16.gguf"), None, None).path == "sub/x-mmproj-bf16.gguf"
    with pytest.raises(ModelNotFound, match="no projector 'Q2_K'") as exc:
        choose_projector(REPO, files, "Q4_K_M", "Q2_K")
    assert "mmproj-F16.gguf" in exc.value.hint
    with pytest.raises(ModelNotFound, match="several projectors and none is F16") as exc:
        choose_projector(REPO, _hub_files("m-Q4_K_M.gguf", "mmproj-BF16.gguf", "mmproj-F32.gguf"), "Q4_K_M", None)
    assert "--mmproj NAME" in exc.value.hint


def test_a_stored_conversation_gives_back_the_same_pixels():
    pixels = np.random.default_rng(1).integers(0, 256, (9, 7, 3), dtype=np.uint8)
    image = decode_image(_save(Image.fromarray(pixels, "RGB"), "PNG"))
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "x", "media": [image]}]
    import json

    back = restored(json.loads(json.dumps(stored(messages))))
    assert back[0] == messages[0] and back[1]["media"][0] == image


@pytest.fixture
def stalling_site():
    """A loopback server that answers headers, then sends nothing more."""
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", "1000")
            self.end_headers()
            self.wfile.write(b"\x89PNG")
            self.wfile.flush()
            threading.Event().wait(3)

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_a_media_url_that_stalls_is_cut_at_the_deadline(stalling_site):
    from tallow.serve.media_fetch import fetch_media

    with pytest.raises(APIError, match="took more than 0.5 s"):
        fetch_media(stalling_site + "/slow.png", "messages[0].content[0]", "messages", timeout_s=0.5)
    with pytest.raises(APIError, match="only http, https and data: URLs"):
        fetch_media("ftp://127.0.0.1/x.png", "m", "messages")
