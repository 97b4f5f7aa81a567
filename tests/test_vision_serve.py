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
    server = Server("smollm2:135m", default_home, "--parallel", "2", "--mmproj", str(proj))
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
    ("https://example.com/cat.png", "only data: URIs are taken"),
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
