"""Images on every route, through a model stored with its projector: the same greedy answer
from run, chat, serve and batch, and a second process that finds the picture's cells in the
disk prompt cache instead of encoding it again. Twice: with a LLaVA-style projector, and with
an M-RoPE pair (tests/helpers/mrope.py), whose picture takes fewer positions than cells."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from helpers.mrope import write_mrope_colour_projector, write_mrope_model
from helpers.processes import run_tallow
from helpers.projector import solid_png, write_colour_projector
from helpers.server import Server

pytestmark = pytest.mark.slow
QUESTION = "What colour is this image? Answer with one word."
SYSTEM = "You look at pictures and name their colour. " + "Colours are words. " * 70  # > 256 tokens: saved on disk
MODEL = "vlm"


@pytest.fixture(scope="module", params=["mlp", "mrope"])
def vision_home(request, default_model, tmp_path_factory) -> tuple[Path, Path, int]:
    """A home storing the pair, a red picture, and how many tokens it takes."""
    folder = tmp_path_factory.mktemp(f"vision-routes-{request.param}")
    if request.param == "mlp":
        model, n_tokens = default_model, 4  # resized to 28x28: 2x2 patches
        proj = write_colour_projector(folder / "colour-mmproj.gguf", model)
    else:
        model, n_tokens = write_mrope_model(default_model, folder / "qwen2vl.gguf"), 9  # 3x3 merged patches
        proj = write_mrope_colour_projector(folder / "mmproj-qwen2vl.gguf", model)
    home = folder / "home"
    r = run_tallow(["import", str(model), "--name", MODEL, "--link", "--mmproj", str(proj)], home=home)
    assert r.returncode == 0, r.stderr.decode()
    return home, solid_png(folder / "red.png", (255, 0, 0)), n_tokens


def _run(home: Path, picture: Path, *extra: str) -> dict:
    r = run_tallow(["run", MODEL, QUESTION, "--image", str(picture), "--system", SYSTEM, "--temperature", "0",
                    "--max-tokens", "12", "--json", "--flash-attn", "on", *extra], home=home, env={"TALLOW_NO_LOG": "1"})
    assert r.returncode == 0, r.stderr.decode()
    return json.loads(r.stdout)


def test_the_same_image_question_gives_the_same_answer_on_every_route(vision_home, tmp_path):
    """Flash attention on everywhere (serve and batch turn it on for several sequences; for one,
    "auto" follows this machine's timings, and its kernel rounds otherwise), and two threads
    pinned everywhere (the count follows the free cores, and some kernels split their sums by
    thread: on a busy machine run and serve parted at a near-tie)."""
    home, picture, n_tokens = vision_home
    by_run = _run(home, picture, "--no-cache", "--threads", "2")["text"]
    assert "red" in by_run.lower()

    uri = "data:image/png;base64," + base64.b64encode(picture.read_bytes()).decode()
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": uri}}, {"type": "text", "text": "\n" + QUESTION}]}]  # as run places it
    server = Server(MODEL, home, "--no-cache", "--threads", "2")
    try:
        answer = server.client().chat.completions.create(model=MODEL, temperature=0, max_tokens=12, messages=messages)
        # llama.cpp's native prompt object: the picture goes into the prompt (its n_tokens positions at least)
        b64 = base64.b64encode(picture.read_bytes()).decode()
        native = {"n_predict": 2, "temperature": 0, "cache_prompt": False}
        status, _, seen = server.raw("/completion", json.dumps({**native, "prompt": {
            "prompt_string": "<__media__>\n" + QUESTION, "multimodal_data": [b64]}}).encode())
        assert status == 200, seen
        _, _, plain = server.raw("/completion", json.dumps({**native, "prompt": "\n" + QUESTION}).encode())
        assert seen["tokens_evaluated"] - plain["tokens_evaluated"] >= n_tokens - 1, (seen, plain)
    finally:
        server.close()
    assert answer.choices[0].message.content == by_run

    (tmp_path / "in.jsonl").write_text(json.dumps({"id": "q", "temperature": 0, "max_tokens": 12,
                                                   "messages": messages}) + "\n")
    r = run_tallow(["batch", str(tmp_path / "in.jsonl"), "-o", str(tmp_path / "out.jsonl"), "--model", MODEL,
                    "--no-cache", "--threads", "2"], home=home, env={"TALLOW_NO_LOG": "1"})
    assert r.returncode == 0, r.stderr.decode()
    assert json.loads((tmp_path / "out.jsonl").read_text())["text"] == by_run

    script = f"/image {picture}\n{QUESTION}\n/bye\n".encode()
    r = run_tallow(["chat", MODEL, "--system", SYSTEM, "--temperature", "0", "--max-tokens", "12", "--no-log",
                    "--no-cache", "--flash-attn", "on", "--threads", "2"], home=home, input=script)
    assert r.returncode == 0, r.stderr.decode()
    assert by_run.strip() in r.stdout.decode()


def test_a_second_process_finds_the_picture_in_the_disk_cache(vision_home):
    home, picture, n_tokens = vision_home
    first = _run(home, picture)
    second = _run(home, picture)
    assert second["text"] == first["text"]
    assert first["usage"]["media_tokens"] == second["usage"]["media_tokens"] == n_tokens
    assert second["usage"]["cache_source"] == "disk"
    # every prompt token but the last came from disk, the picture's included: no encode
    assert second["usage"]["cached_tokens"] == second["usage"]["prompt_tokens"] - 1
    assert first["timings"]["media_ms"] > 0 and not second["timings"].get("media_ms")
