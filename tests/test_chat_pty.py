"""A real chat driven through a pseudo-terminal: turns, slash commands, Ctrl-C, and on."""

from __future__ import annotations

import json
import os
import re

import pytest
from helpers.processes import run_tallow
from helpers.terminal import Terminal

pytestmark = pytest.mark.slow  # the default model on a pty


def test_chat_turns_commands_ctrl_c_and_on(default_home):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TALLOW_")}
    env.update(TALLOW_HOME=str(default_home), NO_COLOR="1", TERM="xterm")
    term = Terminal(["chat", "smollm2:135m", "--temperature", "0", "--max-tokens", "24"], env)
    term.read_until(r">>> ")
    term.send("Say hello.\r")
    first = term.read_until(r"TTFT.*\n(.|\n)*>>> ")
    assert "prompt" in first and "(0 cached)" in first

    # Ctrl-C at the prompt clears the line. Typed as a person types: the keys, then (once they
    # show) Ctrl-C. Sent in one write, ^C could flush the keys readline had been told were
    # there, leaving it blocked in read() with the interrupt unseen until the next key.
    term.send("half a line")
    term.read_until(r"half a line")
    term.send("\x03")  # sent the moment the echo shows: as readline returns to its select()
    term.read_until(r">>> ", timeout=60)  # a ^C that lands before the select() is resent (runtime/host/interrupt.py)
    term.send("/stats\r")
    assert "turns 1" in term.read_until(r"turns \d+.*\n")
    term.send("/set max_tokens 2000\r")
    term.read_until(r"max_tokens = 2000")

    term.send('"""Write a very long essay\rabout the history of the oceans.\r"""\r')
    term.read_until(r"[A-Za-z]{3,}.{200,}")  # the answer is streaming
    term.send("\x03")
    interrupted = term.read_until(r"\[interrupted\](.|\n)*TTFT.*\n(.|\n)*>>> ")
    assert "interrupted" in interrupted

    term.send("Say goodbye.\r")
    last = term.read_until(r"TTFT.*\n(.|\n)*>>> ")
    cached = int(re.search(r"\((\d+) cached\)", last).group(1))
    assert cached > 0  # the earlier turns, the cut answer included, came from the KV cache
    term.send("/stats\r")
    assert "turns 3" in term.read_until(r"turns \d+.*\n")
    term.send("/bye\r")
    assert term.wait() == 0


def test_ctrl_g_and_edit_write_the_message_in_the_editor(default_home, tmp_path):
    # The "editor": appends to the draft it is given, and keeps a copy of what it was given.
    editor = tmp_path / "editor.sh"
    editor.write_text(f'#!/bin/sh\ncp "$1" {tmp_path}/given.txt\nprintf "%s, in one word." "$(cat "$1")" > "$1"\n')
    editor.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TALLOW_", "VISUAL"))}
    env.update(TALLOW_HOME=str(tmp_path / "home"), TALLOW_MODELS=str(default_home / "models"), NO_COLOR="1",
               TERM="xterm", EDITOR=str(editor))
    term = Terminal(["chat", "smollm2:135m", "--temperature", "0", "--max-tokens", "8"], env)
    term.read_until(r">>> ")
    term.send("Name a colour")
    term.read_until(r"Name a colour")
    term.send("\x07")  # Ctrl+G: the line typed so far goes to the editor
    sent = term.read_until(r"TTFT.*\n(.|\n)*>>> ", timeout=120)
    assert (tmp_path / "given.txt").read_text() == "Name a colour"
    assert "Name a colour, in one word." in sent and "prompt" in sent
    term.send("/edit Say hi\r")
    again = term.read_until(r"TTFT.*\n(.|\n)*>>> ", timeout=120)
    assert "Say hi, in one word." in again and "(" in again
    term.send("/bye\r")
    assert term.wait() == 0
    logged = run_tallow(["logs", "-n", "5", "--json"], home=tmp_path / "home")  # what was sent is what is kept
    prompts = [turn["prompt"] for turn in json.loads(logged.stdout)]
    assert "Name a colour, in one word." in prompts and "Say hi, in one word." in prompts
