"""The chat page's server side: its files (vendored libraries checked, a size budget, nothing
from elsewhere), GET / for browsers and for Ollama's clients, the headers that keep the page
to its origin, the key rules, the conversation routes over the history log, and `tallow ui`.
The page itself, in a browser, is tests/test_ui_browser.py."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.processes import run_tallow, tallow_env

from tallow.serve.ui.page import CSP, load_assets

STATIC = Path(__file__).resolve().parent.parent / "serve" / "ui" / "static"
BUDGET = 300 * 1024  # gzipped bytes of every file the page ships


def test_vendored_files_are_the_packages_bytes():
    table = (STATIC / "vendor" / "README.md").read_text()
    rows = re.findall(r"^\| `([^`]+)` \|.*\| ([0-9a-f]{64}) \|$", table, re.M)
    assert {name for name, _ in rows} == {"marked.esm.js", "purify.es.js"}
    for name, digest in rows:
        assert hashlib.sha256((STATIC / "vendor" / name).read_bytes()).hexdigest() == digest, name
    for licence in ("LICENSE-marked.txt", "LICENSE-dompurify.txt"):
        assert "Permission" in (STATIC / "vendor" / licence).read_text() or "Apache" in (STATIC / "vendor" / licence).read_text()


def test_the_assets_fit_the_size_budget_and_are_all_packaged():
    assets = load_assets()
    on_disk = {str(p.relative_to(STATIC)) for p in STATIC.rglob("*") if p.is_file()}
    assert set(assets) == on_disk, "a file under static/ has a type the page does not serve"
    total = sum(len(gzip.compress(a.body, 9)) for a in assets.values())
    print(f"chat page: {len(assets)} files, {sum(len(a.body) for a in assets.values())} bytes, {total} gzipped")
    assert total < BUDGET
    pyproject = (STATIC.parents[2] / "pyproject.toml").read_text()
    for pattern in re.search(r'"tallow.serve.ui" = \[([^\]]*)\]', pyproject).group(1).split(","):
        assert pattern.strip().strip('"').startswith("static/")
    shipped = {p for pat in ("static/*.html", "static/*.js", "static/*.css", "static/*.svg", "static/vendor/*")
               for p in (STATIC.parent).glob(pat)}
    assert {STATIC / n for n in on_disk} <= shipped, "pyproject's package-data misses a file of the page"


def test_the_pages_own_files_name_no_other_origin():
    """Every URL in the page's own files is a path on this origin (the vendored libraries
    carry URLs in comments and error texts; the CSP stops them being fetched)."""
    for path in STATIC.glob("*.*"):
        text = path.read_text()
        for ref in re.findall(r"""(?:src|href)=["']([^"']+)""", text) + re.findall(r"""from ["']([^"']+)""", text):
            if ref.startswith("${"):
                continue  # a link in a model's answer (markdown.js): followed only when clicked
            assert ref.startswith(("/", "./", "#")), f"{path.name} refers to {ref}"
        text = text.replace('xmlns="http://www.w3.org/2000/svg"', "")  # a namespace name, never fetched
        assert "http://" not in text and "https://" not in text.replace("https?:", ""), path.name


@pytest.fixture(scope="module")
def page_server(synth_model, tmp_path_factory):
    from helpers.server import Server

    home = tmp_path_factory.mktemp("uihome")
    s = Server(synth_model, home, env={"TALLOW_NO_LOG": "0"})
    s.home = home
    yield s
    s.close()


HTML = {"Accept": "text/html,application/xhtml+xml"}


def test_a_browser_gets_the_page_and_ollamas_clients_the_liveness_text(page_server):
    status, headers, body = page_server.raw("/", headers=HTML)
    assert status == 200 and headers["Content-Type"].startswith("text/html") and "<title>tallow</title>" in body
    assert headers["Content-Security-Policy"] == CSP
    assert "connect-src 'self'" in CSP and "script-src 'self';" in CSP and "unsafe-inline" not in CSP
    assert headers["X-Content-Type-Options"] == "nosniff" and headers["X-Frame-Options"] == "DENY"
    assert page_server.raw("/")[2] == "tallow is running"  # the ollama client's probe sends no Accept
    assert page_server.raw("/", headers={"Accept": "*/*"})[2] == "tallow is running"
    status, headers, body = page_server.raw("/ui/assets/main.js")
    assert status == 200 and headers["Content-Type"].startswith("text/javascript") and "import" in body
    assert headers["Content-Security-Policy"] == CSP
    etag = headers["ETag"]
    assert page_server.raw("/ui/assets/main.js", headers={"If-None-Match": etag})[0] == 304
    import urllib.request

    req = urllib.request.Request(page_server.url + "/ui/assets/app.css", headers={"Accept-Encoding": "gzip"})
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.headers["Content-Encoding"] == "gzip"
        assert gzip.decompress(r.read()) == (STATIC / "app.css").read_bytes()
    assert page_server.raw("/ui/assets/../../pyproject.toml")[0] == 404
    assert page_server.raw("/ui/assets/nothing.js")[0] == 404


def test_the_page_keeps_the_host_check(page_server):
    status, _, body = page_server.raw("/", headers={**HTML, "Host": "evil.example"})
    assert status == 403 and body["error"]["code"] == "host_not_allowed"
    assert page_server.raw("/ui/api/conversations", headers={"Host": "evil.example:80"})[0] == 403


def turn(index, prompt, response, **extra):
    return json.dumps({"index": index, "model": "synthetic.gguf", "system": "Be brief.", "prompt": prompt,
                       "response": response, "finish_reason": "stop",
                       "usage": {"prompt_tokens": 20, "cached_tokens": 3, "completion_tokens": 4},
                       "timings": {"ttft_ms": 12.5, "decode_tps": 100.0}, **extra}).encode()


def test_conversations_are_kept_in_the_history_log(page_server):
    cid = "0123456789ab"
    post = {"Content-Type": "application/json"}
    assert page_server.raw(f"/ui/api/conversations/{cid}/turns", turn(0, "first?", "one"), post)[0] == 200
    assert page_server.raw(f"/ui/api/conversations/{cid}/turns", turn(1, "second?", "two"), post)[0] == 200
    # an edited second question replaces the second turn, in one transaction
    calls = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    assert page_server.raw(f"/ui/api/conversations/{cid}/turns", turn(1, "second, edited?", "", tool_calls=calls),
                           post)[0] == 200
    _, _, conv = page_server.raw(f"/ui/api/conversations/{cid}")
    assert [t["prompt"] for t in conv["turns"]] == ["first?", "second, edited?"]
    assert conv["system"] == "Be brief." and conv["turns"][1]["tool_calls"] == calls
    assert conv["turns"][0]["usage"]["cached_tokens"] == 3 and conv["turns"][0]["timings"]["ttft_ms"] == 12.5
    _, _, listing = page_server.raw("/ui/api/conversations")
    assert listing["kept"] is True and listing["conversations"][0]["title"] == "first?"
    assert page_server.raw(f"/ui/api/conversations/{cid}", json.dumps({"title": "Renamed"}).encode(), post,
                           "PATCH")[0] == 200
    assert page_server.raw("/ui/api/conversations")[2]["conversations"][0]["title"] == "Renamed"
    # the same database tallow logs reads
    logs = run_tallow(["logs", "--json", "-n", "5"], home=page_server.home)
    assert logs.returncode == 0 and "second, edited?" in logs.stdout.decode()
    assert page_server.raw(f"/ui/api/conversations/{cid}", method="DELETE")[2] == {"id": cid, "deleted": True}
    assert page_server.raw(f"/ui/api/conversations/{cid}")[0] == 404
    assert page_server.raw(f"/ui/api/conversations/{cid}", method="DELETE")[0] == 404


@pytest.mark.parametrize("path, body, method, field", [
    ("/ui/api/conversations/NOTHEX/turns", turn(0, "q", "a"), "POST", None),
    ("/ui/api/conversations/0123456789ab/turns", b"{not json", "POST", None),
    ("/ui/api/conversations/0123456789ab/turns", b'{"index": 0, "model": "m", "prompt": "q", "nope": 1}', "POST", "nope"),
    ("/ui/api/conversations/0123456789ab/turns", b'{"index": -1, "model": "m", "prompt": "q"}', "POST", "index"),
    ("/ui/api/conversations/0123456789ab/turns", b'{"index": 0, "model": "m", "prompt": ""}', "POST", "prompt"),
    ("/ui/api/conversations/0123456789ab/turns", b'{"index": 0, "model": "m", "prompt": "q", "usage": {"x": 1}}',
     "POST", "usage"),
    ("/ui/api/conversations/0123456789ab/turns", b'{"index": 0, "model": "m", "prompt": "q", "timings": {"t": "1"}}',
     "POST", "timings"),
    ("/ui/api/conversations/0123456789ab", b'{"title": "   "}', "PATCH", "title"),
    ("/ui/api/conversations/0123456789ab", b'{"title": "x", "colour": "red"}', "PATCH", "colour"),
])
def test_bad_conversation_requests_are_400s_in_openais_shape(page_server, path, body, method, field):
    status, _, answer = page_server.raw(path, body, {"Content-Type": "application/json"}, method)
    assert status == 400, answer
    assert set(answer["error"]) >= {"message", "type"}
    if field:
        assert field in answer["error"]["message"]


def test_with_the_log_off_the_page_is_told_nothing_is_kept(synth_model, tmp_path):
    from helpers.server import Server

    s = Server(synth_model, tmp_path)  # the helper's TALLOW_NO_LOG=1
    try:
        assert s.raw("/ui/api/conversations")[2] == {"kept": False, "conversations": []}
        status, _, body = s.raw("/ui/api/conversations/0123456789ab/turns", turn(0, "q", "a"),
                                {"Content-Type": "application/json"})
        assert status == 409 and body["error"]["code"] == "history_off"
    finally:
        s.close()


def test_no_ui_leaves_the_liveness_text_only(synth_model, tmp_path):
    from helpers.server import Server

    s = Server(synth_model, tmp_path, "--no-ui")
    try:
        assert s.raw("/", headers=HTML)[2] == "tallow is running"
        assert s.raw("/ui/assets/main.js")[0] == 404
        assert s.raw("/ui/api/conversations")[0] == 404
    finally:
        s.close()


def test_with_a_key_the_files_are_open_and_every_call_needs_it(synth_model, tmp_path):
    from helpers.server import Server

    s = Server(synth_model, tmp_path, "--api-key", "sesame", env={"TALLOW_NO_LOG": "0"})
    try:
        assert s.raw("/", headers=HTML)[0] == 200 and s.raw("/ui/assets/api.js")[0] == 200
        assert s.raw("/ui/api/conversations")[0] == 401 and s.raw("/v1/models")[0] == 401
        assert s.raw("/ui/api/conversations", headers={"Authorization": "Bearer sesame"})[0] == 200
        assert s.raw("/ui/assets/api.js", method="POST")[0] in (401, 405)
    finally:
        s.close()


@pytest.fixture
def browser_stub(tmp_path):
    """A BROWSER that records what it was asked to open (Python's webbrowser runs $BROWSER)."""
    seen = tmp_path / "opened.txt"
    stub = tmp_path / "browser.sh"
    stub.write_text(f'#!/bin/sh\nprintf "%s\\n" "$1" >> {seen}\n')
    stub.chmod(stub.stat().st_mode | stat.S_IEXEC)
    return stub, seen


def test_tallow_ui_opens_the_page_of_a_running_server(page_server, browser_stub):
    stub, seen = browser_stub
    r = run_tallow(["ui", "synthetic.gguf", "--host", page_server.url], home=page_server.home,
                   env={"BROWSER": str(stub)})
    assert r.returncode == 0, r.stderr
    assert f"chat page: {page_server.url}/?model=synthetic.gguf" in r.stderr.decode()
    assert seen.read_text().split() == [f"{page_server.url}/?model=synthetic.gguf"]


def test_tallow_ui_starts_a_loopback_server_when_none_runs(synth_model, tmp_path, browser_stub):
    import socket

    stub, seen = browser_stub
    with socket.socket() as probe:  # a port nothing listens on, for tallow to take
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "tallow.cli", "ui", str(synth_model), "--host", f"127.0.0.1:{port}"],
                            env=tallow_env(tmp_path, {"BROWSER": str(stub), "TALLOW_NO_LOG": "1"}),
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        lines = []
        while not any("chat page:" in line for line in lines):
            line = proc.stderr.readline()
            assert line, "tallow ui exited:\n" + "".join(lines)
            lines.append(line)
        assert any("starting tallow serve" in line for line in lines)
        import urllib.request

        with urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/", headers=HTML), timeout=30) as r:
            assert "<title>tallow</title>" in r.read().decode()
        for _ in range(100):  # the stub runs in the background of webbrowser
            if seen.exists():
                break
            import time

            time.sleep(0.1)
        assert seen.read_text().startswith(f"http://localhost:{port}/?model=")
    finally:
        proc.terminate()
        proc.wait(30)


def test_tallow_ui_refuses_a_remote_host_offline_and_a_foreign_server(tmp_path):
    import http.server
    import threading

    r = run_tallow(["ui", "--host", "203.0.113.9:8080", "--offline"], home=tmp_path)
    assert r.returncode == 1 and r.stderr.decode().count("\n") <= 2 and "offline" in r.stderr.decode()
    assert not os.path.exists(tmp_path / "history.db")

    class Other(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the handler's name is the standard library's
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b'{"ok": true}')

        def log_message(self, *args):
            pass

    other = http.server.HTTPServer(("127.0.0.1", 0), Other)
    threading.Thread(target=other.handle_request, daemon=True).start()  # one request, then it is done
    try:
        r = run_tallow(["ui", "--host", f"127.0.0.1:{other.server_address[1]}"], home=tmp_path)
        assert r.returncode == 1 and "not a tallow server" in r.stderr.decode()
    finally:
        other.server_close()
