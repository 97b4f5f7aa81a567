"""tallow launch AGENT against a temporary HOME and a running tallow server: each agent's own
file written in its own format (read back with a parser of that format), the user's other
settings kept, the old file kept beside it and put back byte for byte by --restore."""

from __future__ import annotations

import json
import os

import pytest
from helpers.processes import run_tallow
from helpers.server import Server
from helpers.synth import write_synthetic_gguf

yaml = pytest.importorskip("yaml")
tomllib = pytest.importorskip("tomllib")  # Python 3.11's TOML reader

BEFORE = {  # what a user had: settings of their own that launch must keep (or keep aside)
    "claude": (".claude/settings.json", '{"theme": "dark", "env": {"HTTP_PROXY": "http://proxy:3128"}}\n'),
    "codex": (".codex/config.toml", 'approval_policy = "never"\nmodel = "gpt-5"\n\n[mcp_servers.docs]\ncommand = "docs-mcp"\n'),
    "opencode": (".config/opencode/opencode.json", '{"theme": "tokyonight", "provider": {"other": {"npm": "x"}}}\n'),
    "aider": (".aider.conf.yml", "dark-mode: true\nmodel: gpt-4o\n"),
    "continue": (".continue/config.yaml", "name: mine\nversion: 0.0.1\nschema: v1\nmodels: []\n"),
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("launch")
    s = Server(write_synthetic_gguf(d / "coder.gguf", script={"\n": "a", "a": "<|im_end|>"}), d / "home")
    yield s
    s.close()


def launch(home, server, *args: str):
    env = {"HOME": str(home), "TALLOW_HOST": server.url}
    return run_tallow(["launch", *args], home=home / "tallow", env=env)


def check(agent: str, text: str, url: str) -> None:
    """The written file as its agent reads it: pointing at the server, with the served model."""
    if agent == "claude":
        env = json.loads(text)["env"]
        assert env["ANTHROPIC_BASE_URL"] == url and env["ANTHROPIC_MODEL"] == "coder.gguf"
        assert env["HTTP_PROXY"] == "http://proxy:3128" and json.loads(text)["theme"] == "dark"
    elif agent == "codex":
        data = tomllib.loads(text)
        assert (data["model"], data["model_provider"], data["approval_policy"]) == ("coder.gguf", "tallow", "never")
        assert data["model_providers"]["tallow"] == {"name": "tallow", "base_url": url + "/v1", "wire_api": "responses"}
        assert data["mcp_servers"]["docs"]["command"] == "docs-mcp"
    elif agent == "opencode":
        data = json.loads(text)
        assert data["model"] == "tallow/coder.gguf" and data["provider"]["tallow"]["options"]["baseURL"] == url + "/v1"
        assert "other" in data["provider"] and data["theme"] == "tokyonight"
    elif agent == "aider":
        data = yaml.safe_load(text)
        assert (data["openai-api-base"], data["model"], data["dark-mode"]) == (url + "/v1", "openai/coder.gguf", True)
    else:
        model = yaml.safe_load(text)["models"][0]
        assert (model["provider"], model["apiBase"], model["model"]) == ("openai", url + "/v1", "coder.gguf")


@pytest.mark.parametrize("agent", sorted(BEFORE))
def test_each_agents_file_is_written_kept_and_restored(server, tmp_path, agent):
    rel, before = BEFORE[agent]
    path = tmp_path / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(before)
    shown = launch(tmp_path, server, agent, "--print")
    assert shown.returncode == 0, shown.stderr.decode()
    assert path.read_text() == before  # --print writes nothing
    done = launch(tmp_path, server, agent, "--yes")
    assert done.returncode == 0, done.stderr.decode()
    check(agent, path.read_text(), server.url)
    assert shown.stdout.decode().split("\n", 1)[1] == path.read_text()  # what --print showed is what was written
    assert (path.parent / (path.name + ".tallow-backup")).read_text() == before
    again = launch(tmp_path, server, agent, "--yes", "--model", "other")
    assert again.returncode == 0 and (path.parent / (path.name + ".tallow-backup")).read_text() == before
    back = launch(tmp_path, server, agent, "--restore")
    assert back.returncode == 0, back.stderr.decode()
    assert path.read_text() == before and not (path.parent / (path.name + ".tallow-backup")).exists()


def test_a_file_that_was_not_there_is_removed_again(server, tmp_path):
    done = launch(tmp_path, server, "claude", "--yes")
    assert done.returncode == 0, done.stderr.decode()
    assert (tmp_path / ".claude" / "settings.json").is_file()
    assert launch(tmp_path, server, "claude", "--restore").returncode == 0
    assert not (tmp_path / ".claude" / "settings.json").exists()
    nothing = launch(tmp_path, server, "claude", "--restore")
    assert nothing.returncode == 1 and "nothing to restore" in nothing.stderr.decode()


def test_refusals_leave_nothing_written(server, tmp_path):
    out = launch(tmp_path, server, "cursor")
    assert out.returncode == 2 and "'cursor' is not one of claude, codex, opencode, aider, continue" in out.stderr.decode()
    out = launch(tmp_path, server, "codex")  # not on a terminal, no --yes
    assert out.returncode == 2 and "--yes" in out.stderr.decode()
    assert not (tmp_path / ".codex").exists()
    broken = tmp_path / ".claude" / "settings.json"
    broken.parent.mkdir(parents=True)
    broken.write_text("{not json")
    out = launch(tmp_path, server, "claude", "--yes")
    assert out.returncode == 1 and "is not JSON" in out.stderr.decode() and broken.read_text() == "{not json"


def test_the_agent_runs_with_the_key_when_installed(server, tmp_path):
    from helpers.terminal import Terminal

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "codex"
    fake.write_text("#!/bin/sh\necho \"codex started with key $TALLOW_API_KEY\"\n")
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TALLOW_")}
    env.update(HOME=str(tmp_path), TALLOW_HOME=str(tmp_path / "tallow"), TALLOW_HOST=server.url,
               PATH=f"{bin_dir}:{env['PATH']}", NO_COLOR="1", TERM="xterm")
    term = Terminal(["launch", "codex", "--api-key", "s3cret"], env)
    term.read_until(r"\[y/N\] ")
    term.send("y\r")
    term.read_until("codex started with key s3cret")
    assert 'env_key = "TALLOW_API_KEY"' in (tmp_path / ".codex" / "config.toml").read_text()
    env["PATH"] = "/usr/bin:/bin"
    term = Terminal(["launch", "aider"], env)
    term.read_until(r"\[y/N\] ")
    term.send("y\r")
    term.read_until(r"Aider is not installed here: pip install aider-chat")


def test_with_no_server_one_is_started_and_answers_before_the_agent_runs(default_home, tmp_path):
    import re
    import signal
    import socket
    import time
    import urllib.request

    with socket.socket() as s:  # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    env = {"HOME": str(tmp_path), "TALLOW_HOST": url, "TALLOW_HOME": str(default_home), "PATH": "/usr/bin:/bin"}
    failed = run_tallow(["launch", "aider", "--model", str(tmp_path / "none.gguf"), "--yes"], home=default_home, env=env)
    assert failed.returncode == 1 and "stopped (exit 1) before it answered" in failed.stderr.decode()
    out = run_tallow(["launch", "aider", "--model", "smollm2:135m", "--yes"], home=default_home, env=env)
    err = out.stderr.decode()
    pid = int(re.search(r"started tallow serve smollm2:135m at \S+ \(pid (\d+);", err).group(1))
    try:
        assert out.returncode == 0, err
        with urllib.request.urlopen(url + "/v1/models", timeout=10) as r:  # it answered before launch returned
            assert "smollm2:135m" in [m["id"] for m in json.loads(r.read())["data"]]
        assert yaml.safe_load((tmp_path / ".aider.conf.yml").read_text())["openai-api-base"] == url + "/v1"
    finally:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.2)
        else:
            os.kill(pid, signal.SIGKILL)
