"""`tallow serve --mcp CONFIG`: the chat page offers the MCP servers' tools and runs a call
only when the person allows it in the page; the APIs never run one.

The notes server (tests/helpers/mcp_servers.py) writes each call it runs to a log file, so a
test can tell exactly which calls ran. The model calls notes_read_note and answers "OK" once
it has read a tool result (helpers.mcp_servers.caller_model).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from helpers.browser import CHROMIUM, Watched
from helpers.mcp_servers import caller_model
from helpers.processes import run_tallow
from helpers.server import Server

pytest.importorskip("mcp")
pytestmark = pytest.mark.slow  # a server (and a browser) per module
NOTES = Path(__file__).parent / "helpers" / "mcp_servers.py"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("uimcp")
    model, calls = caller_model(d / "caller.gguf", ctx_train=8192), d / "calls.log"  # the tools' schemas are long
    config = d / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {
        "notes": {"command": sys.executable, "args": [str(NOTES)], "env": {"NOTES_LOG": str(calls)}},
        "broken": {"command": str(d / "no-such-server")}}}))
    s = Server(model, d / "home", "--mcp", str(config), "--parallel", "1", "--ctx", "8192", env={"TALLOW_NO_LOG": "0"})
    yield s, calls
    s.close()


def ran(calls: Path) -> list[str]:
    return calls.read_text().splitlines() if calls.exists() else []


def test_the_apis_never_run_a_tool_and_the_page_routes_guard_theirs(setup):
    s, calls = setup
    status, _, listed = s.raw("/ui/api/tools")
    assert status == 200 and {t["function"]["name"] for t in listed["tools"]} == {"notes_read_note", "notes_list_notes"}
    assert list(listed["failed"]) == ["broken"]
    # a client's request: the model's call comes back to the client, nothing is run
    reply = s.client().chat.completions.create(model="caller.gguf", messages=[{"role": "user", "content": "hi"}],
                                               tools=listed["tools"], max_tokens=32)
    assert reply.choices[0].message.tool_calls[0].function.name == "notes_read_note"
    assert ran(calls) == []
    call = json.dumps({"name": "notes_read_note", "arguments": {"name": "ideas"}}).encode()
    as_json = {"Content-Type": "application/json"}
    for headers in ({**as_json, "Origin": "http://evil.example"}, {"Content-Type": "text/plain"},
                    {**as_json, "Sec-Fetch-Site": "cross-site"}):
        status, _, body = s.raw("/ui/api/tools/call", call, headers)
        assert status == 403 and body["error"]["code"] == "cross_origin", headers
    assert ran(calls) == []
    status, _, body = s.raw("/ui/api/tools/call", call, {**as_json, "Origin": s.url})
    assert status == 200 and body == {"name": "notes_read_note", "content": "the note ideas says: buy oat milk",
                                      "is_error": False}
    assert ran(calls) == ["read_note ideas"]
    for bad, code in (({"name": "shell_run", "arguments": {}}, 404), ({"name": "notes_read_note", "arguments": []}, 400),
                      ({"name": "notes_read_note", "cwd": "/"}, 400)):
        assert s.raw("/ui/api/tools/call", json.dumps(bad).encode(), as_json)[0] == code, bad
    assert "left out: broken" in "".join(s.log).lower() or "broken is left out" in "".join(s.log)


def test_running_a_tool_for_the_page_is_an_admin_right_under_keys():
    from tallow.serve.http.key_check import route_group

    assert route_group("POST", "/ui/api/tools/call") == "admin"  # a tool runs with the server's rights
    assert route_group("GET", "/ui/api/tools") == "generate"


def test_serve_mcp_refuses_what_cannot_work(tmp_path):
    config = tmp_path / "mcp.json"
    config.write_text('{"mcpServers": {}}')
    r = run_tallow(["serve", "--mcp", str(config), "--no-ui", "--port", "0"], home=tmp_path)
    assert r.returncode == 2 and "--mcp" in r.stderr.decode()


sync_api = pytest.importorskip("playwright.sync_api")


def test_the_page_asks_before_each_call_and_keeps_what_ran(setup):
    if CHROMIUM is None:
        pytest.skip("Debian's chromium is not installed")
    s, calls = setup
    before = len(ran(calls))
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        w = Watched(browser, s.url)
        try:
            w.open("?model=caller.gguf")
            page = w.page
            for i, choice in enumerate(("allow", "deny", "always", None)):
                w.send(f"What do my groceries need? ({i})")
                if choice is not None:
                    card = page.locator(".approval")
                    card.wait_for(timeout=120_000)
                    assert "notes_read_note" in card.inner_text() and "groceries" in card.inner_text()
                    card.locator(f"[data-action={choice}]").click()
                node = w.answered(i)
                assert node.locator(".body").inner_text().strip() == "OK", (node.locator(".error").all_inner_texts(), w.errors)
                outcome = node.locator(".call").get_attribute("data-outcome")
                assert outcome == ("denied" if choice == "deny" else "ran"), (i, choice)
                assert page.locator(".approval").count() == 0
            assert len(ran(calls)) - before == 3  # allowed once, always, and then without asking
            assert "buy oat milk" in page.locator('article.assistant[data-index="0"] .call-result').inner_text()
            assert w.errors == [], w.errors
        finally:
            w.close()
            browser.close()
    _, _, listing = s.raw("/ui/api/conversations")
    cid = listing["conversations"][0]["id"]
    turns = s.raw(f"/ui/api/conversations/{cid}")[2]["turns"]
    kept = [t["tool_calls"][0] for t in turns]
    assert [(c["allowed"], c["result"]) for c in kept[:2]] == [
        (True, "the note groceries says: buy oat milk"), (False, "the user did not allow this call")]
    assert all(c["function"]["name"] == "notes_read_note" and c["round"] == 0 for c in kept)
