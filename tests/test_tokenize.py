"""tallow tokenize: a text's tokens from the model's vocabulary alone, as a prompt holds them."""

from __future__ import annotations

import json

import pytest
from helpers.processes import run_tallow

TEXT = "Hello world, <|im_start|> tokens"


def _tokens(home, *args: str, text: str | None = None) -> tuple[int, str, str]:
    out = run_tallow(["tokenize", "smollm2:135m", *args], home=home, input=None if text is None else text.encode())
    return out.returncode, out.stdout.decode(), out.stderr.decode()


def test_the_tokens_are_the_prompts_and_count_as_run_counts(default_home):
    code, listed, err = _tokens(default_home, TEXT)
    assert code == 0, err
    rows = [line.split("\t") for line in listed.splitlines()]
    assert [json.loads(piece) for _, piece in rows][:3] == ["Hello", " world", ","]
    assert ["1", '"<|im_start|>"'] in rows  # the special token is read as one, and shown by its text
    code, counted, _ = _tokens(default_home, "--count", TEXT)
    assert int(counted) == len(rows)
    # run --raw reads the prompt as plain text (no special tokens in it): --no-special counts the same
    ran = run_tallow(["run", "smollm2:135m", TEXT, "--raw", "--max-tokens", "1", "--json", "--no-log"], home=default_home)
    assert ran.returncode == 0, ran.stderr.decode()
    code, plain, _ = _tokens(default_home, "--count", "--no-special", TEXT)
    assert json.loads(ran.stdout)["usage"]["prompt_tokens"] == int(plain) > len(rows)


def test_plain_text_specials_stdin_and_json(default_home):
    code, out, err = _tokens(default_home, "--json", "--no-special", text=TEXT)
    assert code == 0, err
    data = json.loads(out)
    assert data["model"] == "smollm2:135m" and data["count"] == len(data["tokens"])
    assert 1 not in [t["id"] for t in data["tokens"]]  # written out as plain characters instead
    assert "".join(t["piece"] for t in data["tokens"]) == TEXT
    assert "llama_model_loader" not in err  # llama.cpp's loading log stays quiet


@pytest.mark.slow
def test_a_whisper_model_has_no_tokens_to_count(tmp_path):
    from helpers.speech import whisper_folder

    home = tmp_path / "home"
    assert run_tallow(["import", str(whisper_folder()), "--name", "whisper:base", "--link"], home=home).returncode == 0
    out = run_tallow(["tokenize", "whisper:base", "hi"], home=home)
    assert out.returncode == 1 and "is a speech-to-text model" in out.stderr.decode()
