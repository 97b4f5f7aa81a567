"""Images through serve, with the official openai, anthropic and ollama clients."""

from __future__ import annotations

import base64

import pytest
from helpers.projector import solid_png, write_colour_projector
from helpers.server import Server

pytestmark = pytest.mark.slow
QUESTION = "What colour is this image? Answer with one word."


@pytest.fixture(scope="module")
def vision_server(default_home, default_model, tmp_path_factory):
    folder = tmp_path_factory.mktemp("vision-serve")
    proj = write_colour_projector(folder / "colour-mmproj.gguf", default_model)
    pictures = {c: base64.b64encode(solid_png(folder / f"{c}.png", rgb).read_bytes()).decode()
                for c, rgb in (("red", (255, 0, 0)), ("blue", (0, 0, 255)))}
    server = Server("smollm2:135m", default_home, "--parallel", "2", "--mmproj", str(proj), "--allow-media-urls")
    try:
        yield server, pictures
    finally:
        server.close()


def _openai(server, b64, question=QUESTION):
    return server.client().chat.completions.create(
        model="smollm2:135m", temperature=0, max_tokens=12,
        messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b64}"}},
            {"type": "text", "text": question}]}])


@pytest.mark.parametrize("colour,other", [("red", "blue"), ("blue", "red")])
def test_openai_clients_image_url_parts(vision_server, colour, other):
    server, pictures = vision_server
    answer = _openai(server, pictures[colour])
    text = answer.choices[0].message.content.lower()
    assert colour in text and other not in text
    assert answer.usage.prompt_tokens > 4


def test_a_second_question_about_the_image_is_served_from_cache(vision_server):
    server, pictures = vision_server
    first = _openai(server, pictures["red"])
    again = _openai(server, pictures["red"])
    assert again.choices[0].message.content == first.choices[0].message.content
    assert again.usage.prompt_tokens_details.cached_tokens > 4


def test_anthropic_clients_image_blocks(vision_server):
    import anthropic

    server, pictures = vision_server
    client = anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0)
    reply = client.messages.create(model="smollm2:135m", max_tokens=12, extra_body={"temperature": 0}, messages=[
        {"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": pictures["blue"]}},
            {"type": "text", "text": QUESTION}]}])
    assert "blue" in reply.content[0].text.lower()


def test_ollama_clients_images(vision_server):
    import ollama

    server, pictures = vision_server
    reply = ollama.Client(host=server.url).chat(model="smollm2:135m", options={"temperature": 0, "num_predict": 12},
                                                messages=[{"role": "user", "content": QUESTION,
                                                           "images": [pictures["red"]]}])
    assert "red" in reply.message.content.lower()


@pytest.mark.parametrize("url,message", [
    ("file:///etc/passwd", "only data: and http\\(s\\) URLs are taken"),
    ("data:image/png;base64,@@@not-base64@@@", "is not valid base64"),
    ("data:image/png,rawtext", "must be base64"),
    ("data:image/png;base64," + base64.b64encode(b"GIF89a? no").decode(), "truncated or damaged|not an image"),
])
def test_bad_images_are_400s_naming_the_field(vision_server, url, message):
    import json
    import re

    server, _ = vision_server
    body = {"model": "smollm2:135m", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "hi"}]}]}
    status, _, data = server.raw("/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    assert status == 400
    assert re.search(message, data["error"]["message"]) and "messages[0].content[0]" in data["error"]["message"]


def test_a_server_started_without_allow_media_urls_fetches_nothing(replica):
    import openai

    with pytest.raises(openai.BadRequestError, match="this server fetches no URL \\(start it with --allow-media-urls\\)"):
        replica.client().chat.completions.create(model="synthetic.gguf", max_tokens=2, messages=[
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}]}])


@pytest.fixture(scope="module")
def picture_site(tmp_path_factory):
    """A loopback web server with a red picture, a blue one, a huge one and nothing else."""
    import http.server
    import threading

    folder = tmp_path_factory.mktemp("site")
    files = {f"/{c}.png": solid_png(folder / f"{c}.png", rgb).read_bytes()
             for c, rgb in (("red", (255, 0, 0)), ("blue", (0, 0, 255)))}

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            if self.path == "/huge.png":
                self.send_response(200)
                self.send_header("Content-Length", str(64 * 1024 * 1024))
                self.end_headers()
                return
            if self.path == "/moved.png":
                self.send_response(302)
                self.send_header("Location", "/blue.png")
                self.end_headers()
                return
            body = files.get(self.path)
            self.send_response(200 if body else 404)
            self.send_header("Content-Length", str(len(body or b"")))
            self.end_headers()
            self.wfile.write(body or b"")

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_allow_media_urls_fetches_http_images(vision_server, picture_site):
    server, _ = vision_server
    answer = server.client().chat.completions.create(
        model="smollm2:135m", temperature=0, max_tokens=12, messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": f"{picture_site}/red.png"}}, {"type": "text", "text": QUESTION}]}])
    assert "red" in answer.choices[0].message.content.lower()
    import anthropic

    reply = anthropic.Anthropic(base_url=server.url, api_key="none").messages.create(
        model="smollm2:135m", max_tokens=12, extra_body={"temperature": 0}, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "url", "url": f"{picture_site}/moved.png"}},
            {"type": "text", "text": QUESTION}]}])
    assert "blue" in reply.content[0].text.lower()


@pytest.mark.parametrize("path,message", [("/huge.png", "67,108,864 bytes, more than the 20,971,520 taken"),
                                          ("/missing.png", "answered HTTP 404")])
def test_a_media_url_that_fails_is_a_400(vision_server, picture_site, path, message):
    import openai

    server, _ = vision_server
    with pytest.raises(openai.BadRequestError, match=message):
        server.client().chat.completions.create(model="smollm2:135m", max_tokens=2, messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": picture_site + path}}]}])


def test_allow_media_urls_is_refused_offline(default_home):
    from helpers.processes import run_tallow

    r = run_tallow(["serve", "smollm2:135m", "--allow-media-urls", "--offline"], home=default_home, timeout=60)
    assert r.returncode == 2 and "offline mode is on" in r.stderr.decode()


def test_a_server_without_a_projector_answers_400(replica, tmp_path):
    import openai

    picture = "data:image/png;base64," + base64.b64encode(solid_png(tmp_path / "p.png", (0, 0, 0)).read_bytes()).decode()
    with pytest.raises(openai.BadRequestError, match="has no projector"):
        replica.client().chat.completions.create(model="synthetic.gguf", max_tokens=2, messages=[
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": picture}}]}])


def test_ollama_generate_takes_images(vision_server):
    import ollama

    server, pictures = vision_server
    reply = ollama.Client(host=server.url).generate(model="smollm2:135m", prompt=QUESTION, images=[pictures["blue"]],
                                                    options={"temperature": 0, "num_predict": 12})
    assert "blue" in reply.response.lower()


def test_responses_input_image(vision_server):
    server, pictures = vision_server
    reply = server.client().responses.create(model="smollm2:135m", temperature=0, max_output_tokens=12, input=[
        {"role": "user", "content": [
            {"type": "input_image", "image_url": f"data:image/png;base64,{pictures['blue']}", "detail": "auto"},
            {"type": "input_text", "text": QUESTION}]}])
    assert "blue" in reply.output_text.lower() and "red" not in reply.output_text.lower()
    assert reply.usage.model_extra["media_tokens"] == 4
    # continued by id: the stored conversation keeps the picture, and its cells are reused
    again = server.client().responses.create(model="smollm2:135m", temperature=0, max_output_tokens=12,
                                             previous_response_id=reply.id, input="And what colour was it?")
    assert "blue" in again.output_text.lower()
    assert again.usage.model_extra["media_tokens"] == 4 and again.usage.input_tokens_details.cached_tokens > 4


def test_a_detail_tallow_cannot_honour_is_refused_by_name(vision_server):
    import openai

    server, pictures = vision_server
    with pytest.raises(openai.BadRequestError, match=r"detail 'low' is not supported"):
        server.client().chat.completions.create(model="smollm2:135m", max_tokens=2, messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{pictures['red']}", "detail": "low"}}]}])


def test_ollama_show_lists_vision(vision_server, replica):
    import ollama

    server, _ = vision_server
    assert "vision" in ollama.Client(host=server.url).show("smollm2:135m").capabilities
    assert "vision" not in ollama.Client(host=replica.url).show("synthetic.gguf").capabilities


def test_batch_lines_take_images(default_home, default_model, tmp_path):
    import json

    from helpers.processes import run_tallow

    proj = write_colour_projector(tmp_path / "colour-mmproj.gguf", default_model)
    lines = []
    for colour, rgb in (("red", (255, 0, 0)), ("blue", (0, 0, 255))):
        uri = "data:image/png;base64," + base64.b64encode(solid_png(tmp_path / f"{colour}.png", rgb).read_bytes()).decode()
        lines.append(json.dumps({"id": colour, "temperature": 0, "max_tokens": 12, "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": uri}}, {"type": "text", "text": QUESTION}]}]}))
    lines.append(json.dumps({"id": "bad", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,@@"}}]}]}))
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    r = run_tallow(["batch", str(tmp_path / "in.jsonl"), "-o", str(tmp_path / "out.jsonl"), "--mmproj", str(proj),
                    "--parallel", "2"], home=default_home)
    assert r.returncode == 1, r.stderr.decode()  # the bad line failed; the others answered
    records = {rec["id"]: rec for rec in map(json.loads, (tmp_path / "out.jsonl").read_text().splitlines())}
    assert "red" in records["red"]["text"].lower() and "blue" in records["blue"]["text"].lower()
    assert records["red"]["usage"]["media_tokens"] == 4
    assert "not valid base64" in records["bad"]["error"]


@pytest.mark.parametrize("fmt,message", [("wav", "projector has no audio encoder: it cannot take audio"),
                                         ("aiff", "format 'aiff' is not supported: send one of wav, mp3")])
def test_input_audio_parts_are_read_and_refused_by_name(vision_server, fmt, message):
    import openai
    from test_audio import tone, wav

    server, _ = vision_server
    data = base64.b64encode(wav(16000, tone(16000, 440))).decode()
    with pytest.raises(openai.BadRequestError, match=message):
        server.client().chat.completions.create(model="smollm2:135m", max_tokens=2, messages=[{"role": "user", "content": [
            {"type": "input_audio", "input_audio": {"data": data, "format": fmt}}, {"type": "text", "text": "hi"}]}])
