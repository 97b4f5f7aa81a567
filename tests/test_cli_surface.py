"""The CLI as a newcomer meets it: help for every command, errors, colour rules."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import run_tallow
from terminal import Terminal


def all_commands() -> list[list[str]]:
    from tallow.cli.reference import commands

    return [path for path in commands() if path]


def test_every_command_has_a_one_line_summary_and_an_example(tmp_path):
    import inspect

    import typer.main

    from tallow.cli.app import app

    root = typer.main.get_command(app)
    for path in all_commands():
        cmd = root
        for name in path:
            cmd = cmd.commands[name]
        doc = inspect.getdoc(cmd.callback) or ""
        summary = doc.split("\n\n")[0]
        assert "\n" not in summary and len(summary) <= 60, (path, summary)
        if not getattr(cmd, "commands", None):  # groups list their commands instead
            assert "Example" in doc, path
    listing = run_tallow(["--help"], home=tmp_path).stdout.decode()
    assert "..." not in listing.split("Commands:")[1].split("Environment")[0]  # no summary cut short


def test_root_help_ends_with_every_setting_and_the_exit_codes(tmp_path):
    from tallow.cli.settings import REGISTRY

    text = run_tallow(["--help"], home=tmp_path).stdout.decode()
    table = text.split("Environment variables:")[1]
    for s in REGISTRY:
        assert s.name in table and s.help in table
    assert text.rstrip().endswith("Exit codes: 0 ok, 1 error, 2 usage, 130 interrupted.")


def test_near_miss_names_get_a_did_you_mean(synth_model, tmp_path):
    r = run_tallow(["run", "qwen", "hi", "--offline"], home=tmp_path)
    lines = r.stderr.decode().splitlines()
    assert r.returncode == 1 and lines == ["error: model 'qwen' not found; did you mean qwen2.5:0.5b or qwen2.5:1.5b?",
                                           "hint: Try: tallow pull qwen2.5:0.5b"]
    assert run_tallow(["import", str(synth_model), "--name", "synthy:tiny"], home=tmp_path).returncode == 0
    r = run_tallow(["run", "synthi:tiny", "hi", "--offline"], home=tmp_path)
    assert "did you mean synthy:tiny?" in r.stderr.decode() and "Try: tallow run synthy:tiny" in r.stderr.decode()
    r = run_tallow(["rm", "synty:tiny"], home=tmp_path)
    assert r.returncode == 1 and "is not stored; did you mean synthy:tiny?" in r.stderr.decode()
    r = run_tallow(["run", "zzzz", "hi", "--offline"], home=tmp_path)
    assert "did you mean" not in r.stderr.decode() and "try one of" in r.stderr.decode()


def _screen(args: list[str], home, **env_extra) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TALLOW_") and k not in ("NO_COLOR", "TERM")}
    env.update(TALLOW_HOME=str(home), **env_extra)
    term = Terminal(args, env)
    assert term.wait() in (0, 1)
    return term.buf.decode(errors="replace")


@pytest.mark.parametrize("env", [{"NO_COLOR": "1", "TERM": "xterm-256color"}, {"TERM": "dumb"}])
def test_no_color_and_dumb_terminals_get_no_escape_codes(synth_model, tmp_path, env):
    assert run_tallow(["import", str(synth_model), "--name", "synthy:tiny"], home=tmp_path).returncode == 0
    # On a real terminal with colour allowed, the same screens do carry escape codes.
    assert "\x1b[" in _screen(["list"], tmp_path, TERM="xterm-256color")
    batch = tmp_path / "in.jsonl"
    batch.write_text('{"id": 1, "prompt": "hi", "max_tokens": 3}\n')
    for args in (["list"], ["show", "synthy:tiny"], ["run", "nosuch", "hi", "--offline"], ["--help"],
                 ["run", "synthy:tiny", "hi", "-n", "4", "--temperature", "0", "--no-log"],
                 ["batch", str(batch), "-o", str(tmp_path / f"out-{len(env)}.jsonl"), "-m", "synthy:tiny"],
                 ["bench", "synthy:tiny", "-p", "8", "-n", "4", "-r", "1"]):
        screen = _screen(args, tmp_path, **env)
        assert "\x1b" not in screen, (args, screen[:200])


def test_pipes_get_plain_text(synth_model, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TALLOW_") and k != "NO_COLOR"}
    env.update(TALLOW_HOME=str(tmp_path), TERM="xterm-256color")
    subprocess.run([sys.executable, "-m", "tallow.cli", "import", str(synth_model), "--name", "s:t"], env=env,
                   capture_output=True, check=True)
    for args in (["list"], ["show", "s:t"], ["run", "s:t", "hi", "-n", "4", "--stats", "--no-log"]):
        r = subprocess.run([sys.executable, "-m", "tallow.cli", *args], env=env, capture_output=True, timeout=120)
        assert r.returncode == 0 and b"\x1b" not in r.stdout + r.stderr, args
