"""Projectors in the store: import --mmproj (copied and linked), pull from a repository with
two projectors, the checks that refuse a wrong one, show, list, rm and the fit check."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.processes import run_tallow
from helpers.projector import solid_png, write_colour_projector

from tallow.models.errors import TallowError
from tallow.models.projector import read_projector
from tallow.models.store import Store, sha256_file

QUESTION = "What colour is this image? Answer with one word."
REPO = "tallow-test/SmolLM2-Vision-GGUF"


pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def projectors(default_model, tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("projectors")
    return {
        "good": write_colour_projector(d / "colour-mmproj-F16.gguf", default_model),
        "other": write_colour_projector(d / "mmproj-Q8_0.gguf", default_model, name="the other one"),
        "wide": write_colour_projector(d / "wide-mmproj.gguf", default_model, n_embd=640),
        "unknown": write_colour_projector(d / "odd-mmproj.gguf", default_model, projector_type="hologram"),
    }


def _home(tmp_path) -> Path:
    return tmp_path / "home"


def _ok(r):
    assert r.returncode == 0, r.stderr.decode()
    return r


def _colour_of(home: Path, model: str, tmp_path: Path, rgb=(255, 0, 0)) -> str:
    picture = solid_png(tmp_path / "picture.png", rgb)
    r = _ok(run_tallow(["run", model, QUESTION, "--image", str(picture), "--temperature", "0", "--max-tokens", "12",
                        "--json"], home=home))
    data = json.loads(r.stdout)
    assert data["usage"]["media_tokens"] == 4
    return data["text"].lower()


def test_import_with_a_projector_then_images_need_no_flag(default_model, projectors, tmp_path):
    home = _home(tmp_path)
    r = _ok(run_tallow(["import", str(default_model), "--name", "smolvlm", "--mmproj", str(projectors["good"])], home=home))
    assert "with the projector colour-mmproj-F16.gguf" in r.stderr.decode()
    store = Store(home / "models")
    manifest = store.get("smolvlm")
    assert manifest.projector.digest == f"sha256-{sha256_file(projectors['good'])}"
    assert manifest.projector_facts["capabilities"] == ["vision"] and manifest.projector_facts["width"] == 576
    assert "red" in _colour_of(home, "smolvlm", tmp_path)
    assert "blue" in _colour_of(home, "smolvlm", tmp_path, (0, 0, 255))

    shown = json.loads(_ok(run_tallow(["show", "smolvlm", "--json"], home=home)).stdout)
    assert shown["capabilities"] == ["completion", "vision"]
    assert shown["projector"]["type"] == "mlp" and shown["projector"]["size"] == projectors["good"].stat().st_size
    assert shown["projector"]["file"] == str(store.projector_path(manifest))
    text = _ok(run_tallow(["show", "smolvlm"], home=home)).stdout.decode()
    assert "completion, vision" in text and "colour-mmproj-F16.gguf (mlp, F32" in text
    listed = _ok(run_tallow(["list"], home=home)).stdout.decode()
    assert "smolvlm:latest (vision)" in listed
    assert json.loads(_ok(run_tallow(["list", "--json"], home=home)).stdout)[0]["media"] == ["vision"]

    fit = json.loads(_ok(run_tallow(["show", "smolvlm", "--fit", "--ctx", "512", "--json"], home=home)).stdout)
    assert fit["projector"] >= projectors["good"].stat().st_size - 4096  # its weights, at least
    assert fit["total"] == fit["weights"] + fit["kv_cache"] + fit["compute"] + fit["output"] + fit["projector"]


def test_a_text_model_without_a_projector_refuses_an_image_by_name(default_model, tmp_path):
    home = _home(tmp_path)
    _ok(run_tallow(["import", str(default_model), "--name", "plain", "--link"], home=home))
    picture = solid_png(tmp_path / "red.png", (255, 0, 0))
    r = run_tallow(["run", "plain", QUESTION, "--image", str(picture)], home=home)
    assert r.returncode == 1
    err = r.stderr.decode().strip()
    assert "plain:latest has no projector: it cannot take images" in err and len(err.splitlines()) <= 2


def test_rm_removes_a_projector_no_other_model_uses(default_model, projectors, tmp_path):
    home = _home(tmp_path)
    for name in ("a", "b"):
        _ok(run_tallow(["import", str(default_model), "--name", name, "--mmproj", str(projectors["good"])], home=home))
    store = Store(home / "models")
    blob = store.projector_path(store.get("a"))
    _ok(run_tallow(["rm", "a"], home=home))
    assert blob.exists()  # b uses it
    r = _ok(run_tallow(["rm", "b", "--dry-run"], home=home))
    assert "would free 98." in r.stderr.decode()  # the weights and the projector
    _ok(run_tallow(["rm", "b"], home=home))
    assert not blob.exists() and not any(store.blobs.iterdir())


def test_import_link_uses_the_projector_in_place(default_model, projectors, tmp_path):
    home = _home(tmp_path)
    own = tmp_path / "mine-mmproj.gguf"
    own.write_bytes(projectors["good"].read_bytes())
    _ok(run_tallow(["import", str(default_model), "--name", "linked", "--link", "--mmproj", str(own)], home=home))
    store = Store(home / "models")
    assert store.get("linked").projector.linked == str(own) and not store.blobs.exists()
    assert "red" in _colour_of(home, "linked", tmp_path)
    listed = _ok(run_tallow(["list"], home=home)).stdout.decode()
    assert "linked:latest (vision, linked)" in listed
    own.write_bytes(projectors["other"].read_bytes())  # changed under the store
    r = run_tallow(["show", "linked"], home=home)
    assert r.returncode == 1 and "changed since it was imported" in r.stderr.decode()
    r = _ok(run_tallow(["rm", "linked"], home=home))
    assert f"kept linked file {own}" in r.stderr.decode() and own.exists()


@pytest.mark.parametrize("which,message", [
    ("wide", "wide-mmproj.gguf gives embeddings 640 wide, but .* takes 576: it is not this model's projector"),
    ("unknown", "odd-mmproj.gguf is a projector of type 'hologram', which this llama.cpp does not know"),
])
def test_import_refuses_a_projector_that_does_not_fit(default_model, projectors, tmp_path, which, message):
    import re

    home = _home(tmp_path)
    r = run_tallow(["import", str(default_model), "--name", "bad", "--mmproj", str(projectors[which])], home=home)
    assert r.returncode == 1 and re.search(message, r.stderr.decode()), r.stderr.decode()
    store = Store(home / "models")
    assert store.get("bad") is None and not (store.blobs.exists() and any(store.blobs.iterdir()))


def test_a_model_file_is_not_a_projector(default_model, synth_model):
    with pytest.raises(TallowError, match="is not a projector: its general.architecture is 'llama'"):
        read_projector(synth_model)


def test_pull_takes_the_projector_of_the_weights_precision(fake_hub, default_model, projectors, tmp_path):
    fake_hub.add(REPO, "SmolLM2-135M-Q8_0.gguf", default_model)
    fake_hub.add(REPO, "mmproj-F16.gguf", projectors["good"])
    fake_hub.add(REPO, "mmproj-Q8_0.gguf", projectors["other"])
    home = _home(tmp_path)
    env = {"HF_ENDPOINT": fake_hub.url}
    r = _ok(run_tallow(["pull", f"{REPO}:Q8_0"], home=home, env=env))
    assert "with its projector mmproj-Q8_0.gguf" in r.stderr.decode()
    store = Store(home / "models")
    manifest = store.get(f"{REPO}:Q8_0")
    assert manifest.projector.digest == f"sha256-{sha256_file(projectors['other'])}"
    assert manifest.source["files"] == ["SmolLM2-135M-Q8_0.gguf", "mmproj-Q8_0.gguf"]
    assert "red" in _colour_of(home, f"{REPO}:Q8_0", tmp_path)

    home2 = tmp_path / "home2"
    r = _ok(run_tallow(["pull", f"{REPO}:Q8_0", "--mmproj", "F16"], home=home2, env=env))
    assert Store(home2 / "models").get(f"{REPO}:Q8_0").projector.path == "mmproj-F16.gguf"
    home3 = tmp_path / "home3"
    _ok(run_tallow(["pull", f"{REPO}:Q8_0", "--no-mmproj"], home=home3, env=env))
    assert Store(home3 / "models").get(f"{REPO}:Q8_0").projector is None
    r = run_tallow(["pull", f"{REPO}:Q8_0", "--mmproj", "Q2_K"], home=tmp_path / "home4", env=env)
    assert r.returncode == 1 and "has no projector 'Q2_K'" in r.stderr.decode()


def test_pull_refuses_a_mismatched_projector_and_keeps_nothing(fake_hub, default_model, projectors, tmp_path):
    repo = "tallow-test/Mismatched-GGUF"
    fake_hub.add(repo, "SmolLM2-135M-Q8_0.gguf", default_model)
    fake_hub.add(repo, "mmproj-F16.gguf", projectors["wide"])
    home = _home(tmp_path)
    r = run_tallow(["pull", f"{repo}:Q8_0"], home=home, env={"HF_ENDPOINT": fake_hub.url})
    err = r.stderr.decode()
    assert r.returncode == 1 and "gives embeddings 640 wide, but SmolLM2-135M-Q8_0.gguf takes 576" in err, err
    assert "the download was deleted" in err
    store = Store(home / "models")
    assert store.get(f"{repo}:Q8_0") is None and not any(store.blobs.iterdir())


def test_audio_for_a_projector_without_an_audio_encoder_is_refused_before_loading(default_model, projectors, tmp_path):
    from test_audio import tone, wav

    home = _home(tmp_path)
    _ok(run_tallow(["import", str(default_model), "--name", "vlm", "--link", "--mmproj", str(projectors["good"])], home=home))
    _ok(run_tallow(["import", str(default_model), "--name", "plain", "--link"], home=home))
    clip = tmp_path / "clip.wav"
    clip.write_bytes(wav(8000, tone(8000, 440)))
    r = run_tallow(["run", "vlm", "What do you hear?", "--audio", str(clip)], home=home)
    assert r.returncode == 1
    assert "vlm:latest's projector colour-mmproj-F16.gguf has no audio encoder: it cannot take audio" in r.stderr.decode()
    r = run_tallow(["run", "plain", "What do you hear?", "--audio", "-"], home=home, input=clip.read_bytes())
    assert r.returncode == 1 and "plain:latest has no projector: it cannot take audio" in r.stderr.decode()
    clip.write_bytes(clip.read_bytes()[:100])
    r = run_tallow(["run", "vlm", "What do you hear?", "--audio", str(clip)], home=home)
    assert r.returncode == 1 and "claims 16,000 bytes of samples but holds 56" in r.stderr.decode()
    script = f"/audio {tmp_path / 'none.wav'}\n/audio {clip}\n/bye\n".encode()
    r = _ok(run_tallow(["chat", "vlm", "--no-log"], home=home, input=script))
    assert "error: cannot read the audio" in r.stderr.decode() and "holds 56" in r.stderr.decode()
