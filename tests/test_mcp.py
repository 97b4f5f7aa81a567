"""MCP servers' tools in tallow run (--mcp): real servers written with the official SDK
(tests/helpers/mcp_servers.py), a model that calls a tool and then answers from its result.

The model is synthetic: its script writes one call to notes_read_note and, once the prompt
ends after a tool result (the template adds '~' there), answers "OK". What the run prints
shows the call was made with the model's arguments, run by the server and its result given
back; the misbehaving servers show what a user sees when one hangs, dies or floods.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from helpers.mcp_servers import caller_model
from helpers.processes import run_tallow

pytest.importorskip("mcp")
SERVER = Path(__file__).parent / "helpers" / "mcp_servers.py"


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return caller_model(tmp_path_factory.mktemp("mcp") / "caller.gguf")


def config(tmp_path: Path, mode: str = "", **more) -> Path:
    servers = {"notes": {"command": sys.executable, "args": [str(SERVER)], "env": {"NOTES_MODE": mode}}, **more}
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": servers}))
    return path


def ask(model: Path, tmp_path: Path, *flags: str, cfg: Path | None = None):
    out = run_tallow(["run", str(model), "What do my groceries need?", "--mcp", str(cfg or config(tmp_path)),
                      "--temperature", "0", "--max-tokens", "32", "--json", "--no-log", *flags], home=tmp_path / "home")
    return out.returncode, out.stdout.decode(), out.stderr.decode()


def test_a_call_is_run_and_its_result_given_back(model, tmp_path):
    code, out, err = ask(model, tmp_path, "--yes")
    assert code == 0, err
    data = json.loads(out)
    assert data["text"] == "OK"  # answered after a tool result: the '~' the template adds only then
    assert data["steps"] == [{"tool": "notes_read_note", "arguments": {"name": "groceries"}, "allowed": True,
                              "error": False, "result": "the note groceries says: buy oat milk"}]
    assert "tool: notes_read_note" in err and "buy oat milk" in err


def test_without_a_terminal_a_call_not_allowed_is_denied_and_the_model_told(model, tmp_path):
    code, out, err = ask(model, tmp_path)
    assert code == 0, err
    step = json.loads(out)["steps"][0]
    assert (step["allowed"], step["result"]) == (False, "the user did not allow this call")
    assert "--allow-tool notes_read_note" in err
    code, out, _ = ask(model, tmp_path, "--allow-tool", "notes_read_note")
    assert json.loads(out)["steps"][0]["allowed"] is True


@pytest.mark.parametrize("mode, result", [
    ("slow", "the tool notes_read_note did not answer within 2 s"),
    ("fail", "no note is called groceries"),
    ("crash", "the tool notes_read_note failed"),
])
def test_a_server_that_hangs_fails_or_dies_is_one_result_and_the_run_goes_on(model, tmp_path, mode, result):
    code, out, err = ask(model, tmp_path, "--yes", "--tool-timeout", "2", cfg=config(tmp_path, mode))
    assert code == 0, err
    data = json.loads(out)
    assert data["text"] == "OK" and data["steps"][0]["error"] is True and result in data["steps"][0]["result"]
    assert "Traceback" not in err


def test_a_huge_result_is_cut_and_says_so(model, tmp_path):
    code, out, err = ask(model, tmp_path, "--yes", cfg=config(tmp_path, "huge"))
    assert code == 0, err
    text = json.loads(out)["steps"][0]["result"]
    assert len(text) < 70_000 and "more characters cut" in text


def test_a_server_that_does_not_start_is_left_out_in_one_line(model, tmp_path):
    cfg = config(tmp_path, broken={"command": "/nonexistent/mcp-server"})
    code, out, err = ask(model, tmp_path, "--yes", cfg=cfg)
    assert code == 0, err
    assert "note: the MCP server broken is left out: [Errno 2] No such file or directory" in err
    assert json.loads(out)["steps"][0]["result"].startswith("the note groceries")


def test_bad_configurations_and_flags_are_refused_by_name(model, tmp_path):
    bad = tmp_path / "bad.json"
    for text, message in (("{}", "has no mcpServers"), ('{"mcpServers": {"x": {"type": "sse", "url": "http://h"}}}',
                                                        "the type 'sse' is not supported"),
                          ('{"mcpServers": {"a b": {"command": "x"}}}', "is not 1 to 40 letters")):
        bad.write_text(text)
        code, _, err = ask(model, tmp_path, cfg=bad)
        assert code == 1 and message in err, err
    out = run_tallow(["run", str(model), "hi", "--yes"], home=tmp_path / "home")
    assert out.returncode == 2 and "--yes and --allow-tool go with --mcp" in out.stderr.decode()


def _http_server(tmp_path: Path):
    import socket
    import subprocess
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, str(SERVER), "http", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, f"http://127.0.0.1:{port}/mcp"
        except OSError:
            time.sleep(0.2)
    proc.kill()
    pytest.fail("the HTTP MCP server did not start")


def test_mcp_ls_lists_stdio_and_http_servers_tools(tmp_path):
    proc, url = _http_server(tmp_path)
    try:
        cfg = config(tmp_path, web={"url": url}, broken={"command": "/nonexistent/mcp-server"})
        out = run_tallow(["mcp", "ls", str(cfg), "--json"], home=tmp_path / "home")
        assert out.returncode == 0, out.stderr.decode()
        data = json.loads(out.stdout)
        names = {t["name"] for t in data["tools"]}
        assert {"notes_read_note", "notes_list_notes", "web_read_note", "web_list_notes"} <= names
        assert data["servers"] == {"notes": True, "web": True, "broken": False}
        shown = run_tallow(["mcp", "ls", str(cfg)], home=tmp_path / "home")
        assert "web_read_note" in shown.stdout.decode() and "4 tools from 2 of 3 servers" in shown.stderr.decode()
        offline = run_tallow(["mcp", "ls", str(config(tmp_path, web={"url": url})), "--offline", "--json"],
                             home=tmp_path / "home")
        assert json.loads(offline.stdout)["failed"] == {"web": "offline: an HTTP server is not contacted"}
    finally:
        proc.kill()
        proc.wait()
    alone = tmp_path / "alone.json"
    alone.write_text(json.dumps({"mcpServers": {"broken": {"command": "/nonexistent/mcp-server"}}}))
    out = run_tallow(["mcp", "ls", str(alone)], home=tmp_path / "home")
    assert out.returncode == 1 and "the MCP server broken is left out" in out.stderr.decode()


@pytest.mark.parametrize("reply, allowed", [("n", False), ("a", True)])
def test_on_a_terminal_each_call_is_asked_for(model, tmp_path, reply, allowed):
    import os

    from helpers.terminal import Terminal

    env = {k: v for k, v in os.environ.items() if not k.startswith("TALLOW_")}
    env.update(TALLOW_HOME=str(tmp_path / "home"), NO_COLOR="1", TERM="xterm")
    term = Terminal(["run", str(model), "What do my groceries need?", "--mcp", str(config(tmp_path)), "--temperature",
                     "0", "--max-tokens", "32", "--json", "--no-log"], env)
    term.read_until(r'tool: notes_read_note \{"name": "groceries"\}')
    term.read_until(r"allow\? \[y\]es once, \[a\]lways for this tool, \[n\]o: ")
    term.send(reply + "\r")
    shown = term.read_until(r'"steps": \[.*\]\}')
    step = json.loads(shown[shown.index('{"model"'):])["steps"][0]
    assert step["allowed"] is allowed
    assert (step["result"] == "the user did not allow this call") is not allowed


def test_tallow_mcp_serve_answers_the_sdks_client(default_home, minilm_model, tmp_path):
    # tallow as an MCP server on stdio, driven by the official SDK's client as an agent would:
    # its tools listed, generate answering as tallow run does, search over an embed index
    import asyncio
    import os

    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    index = tmp_path / "notes.sqlite"
    notes = "Buy oat milk and bread.\nThe boiler needs a service in March.\nCall the dentist on Monday.\n"
    made = run_tallow(["embed", "all-minilm:l6-v2", "--index", str(index)], home=default_home, input=notes.encode())
    assert made.returncode == 0, made.stderr.decode()
    # the model's greedy answer with either attention kernel: a server may choose flash attention
    # otherwise than a run does (for its deeper contexts), and on some CPUs (AMD EPYC with AVX-512)
    # the two kernels' rounding parts this answer after a few tokens
    expected = {json.loads(run_tallow(["run", "smollm2:135m", "Say hello.", "--temperature", "0", "-n", "8", "--json",
                                       "--no-log", "--flash-attn", fa], home=default_home).stdout)["text"]
                for fa in ("on", "off")}
    env = {k: v for k, v in os.environ.items() if not k.startswith("TALLOW_")} | {"TALLOW_HOME": str(default_home)}
    params = StdioServerParameters(command=sys.executable, env=env,
                                   args=["-m", "tallow.cli", "mcp", "serve", "smollm2:135m", "--index", str(index)])

    async def session():
        async with Client(params, read_timeout_seconds=300) as client:
            names = sorted(t.name for t in (await client.list_tools()).tools)
            said = await client.call_tool("generate", {"prompt": "Say hello.", "max_tokens": 8, "temperature": 0})
            found = await client.call_tool("search", {"query": "heating repair", "top": 1})
            bad = await client.call_tool("generate", {"prompt": "hi", "max_tokens": 0})
            return names, said, found, bad

    names, said, found, bad = asyncio.run(session())
    assert names == ["generate", "search"]
    assert not said.is_error and said.content[0].text in expected
    assert not found.is_error and "boiler" in json.dumps(found.structured_content)
    assert bad.is_error and "max_tokens is 1 to 32768" in bad.content[0].text


def test_chat_offers_the_tools_turn_after_turn(model, tmp_path):
    script = b"/tools\nWhat do my groceries need?\nAnd now?\n/bye\n"
    out = run_tallow(["chat", str(model), "--mcp", str(config(tmp_path)), "--yes", "--temperature", "0",
                      "--max-tokens", "32", "--no-log"], home=tmp_path / "home", input=script)
    assert out.returncode == 0, out.stderr.decode()
    err = out.stderr.decode()
    assert "notes_read_note  Read one of the user's notes by its name." in err and "notes_list_notes" in err
    assert err.count("tool: notes_read_note") == 2 and "buy oat milk" in err  # a call each turn, run and shown
    assert out.stdout.decode().count("OK") == 2


def test_the_history_log_keeps_each_call_and_its_result(model, tmp_path):
    home = tmp_path / "home"
    done = run_tallow(["run", str(model), "What do my groceries need?", "--mcp", str(config(tmp_path)), "--yes",
                       "--temperature", "0", "--max-tokens", "32"], home=home)
    assert done.returncode == 0, done.stderr.decode()
    chat = run_tallow(["chat", str(model), "--mcp", str(config(tmp_path)), "--temperature", "0", "--max-tokens", "32"],
                      home=home, input=b"What do my groceries need?\n/bye\n")  # no terminal: the call is denied
    assert chat.returncode == 0, chat.stderr.decode()
    logged = json.loads(run_tallow(["logs", "-n", "2", "--json"], home=home).stdout)
    calls = [t["tool_calls"] for t in reversed(logged)]
    arguments = json.dumps({"name": "groceries"})
    assert [(c[0]["function"], c[0]["allowed"], c[0]["result"], c[0]["round"]) for c in calls] == [
        ({"name": "notes_read_note", "arguments": arguments}, True, "the note groceries says: buy oat milk", 0),
        ({"name": "notes_read_note", "arguments": arguments}, False, "the user did not allow this call", 0)]
    assert all(t["response"] == "OK" and c[0]["id"] for t, c in zip(logged, reversed(calls)))
    shown = run_tallow(["logs", "-n", "2"], home=home).stdout.decode()
    assert f"tool: notes_read_note {arguments} → the note groceries says: buy oat milk" in shown
    assert f"tool: notes_read_note {arguments} denied the user did not allow this call" in shown


def test_each_round_streams_its_text_and_holds_the_call_back(model, tmp_path):
    # what run and chat print as it comes: the content deltas of every round, never the call's markup
    from tallow.client.mcp.config import read_config
    from tallow.client.mcp.hub import McpHub
    from tallow.client.mcp.loop import run_tools
    from tallow.runtime.engine import Engine
    from tallow.runtime.types import LoadSettings, Sampling

    said = []
    with Engine(model, LoadSettings(n_ctx=2048, n_threads=2)) as engine, McpHub(read_config(config(tmp_path))) as hub:
        done = run_tools(engine, [{"role": "user", "content": "What do my groceries need?"}], hub,
                         lambda name, args: True, lambda step: None, said=said.append, max_tokens=32,
                         sampling=Sampling(temperature=0.0))
    assert [d.text for d in said if d.kind == "content"] == ["O", "K"]  # token by token
    shown = [d.text for d in said if d.kind in ("content", "reasoning")]
    assert not any("tool_call" in t or "groceries" in t for t in shown), said
    assert [d.text for d in said if d.kind == "call"] == ["notes_read_note"]  # the call came as a call
    assert done.text == "OK" and done.steps[0].result == "the note groceries says: buy oat milk"
