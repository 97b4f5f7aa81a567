"""Slow and stalled clients: a body that never finishes arriving is a 408, and a client that
stops reading its streamed answer loses the request (its slot is freed) after the stall
timeout, instead of holding the slot until the answer's end."""

from __future__ import annotations

import json
import socket
import time

import pytest
from helpers.server import Server
from helpers.synth import write_synthetic_gguf

pytestmark = pytest.mark.slow  # a server per test


@pytest.fixture(scope="module")
def loop_server(tmp_path_factory):
    d = tmp_path_factory.mktemp("slow")
    # 64 characters a token, so that an unread stream fills the socket buffers (a few MB) well
    # before the answer's 30,000 tokens are done
    model = write_synthetic_gguf(d / "loop.gguf", script={"\n": "=" * 64, "=" * 64: "=" * 64}, ctx_train=32768)
    s = Server(model, d, "--ctx", "32768", "--parallel", "1", "--max-tokens", "32000", "--body-timeout", "1",
               "--stall-timeout", "1")
    yield s
    s.close()


def connect(server, rcvbuf: int | None = None) -> socket.socket:
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:  # a small window: the server's sends block soon after the client stops reading
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(30)
    sock.connect((host, int(port)))
    return sock


def metric(server, name: str, **labels) -> float:
    page = server.raw("/metrics")[2]
    for line in page.splitlines():
        if line.startswith(name) and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_a_body_that_stops_arriving_is_a_408(loop_server):
    sock = connect(loop_server)
    try:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 200\r\n\r\n{\"model\": \"loop.gguf\"")
        answer = b""
        while b"did not arrive" not in answer and (part := sock.recv(4096)):
            answer += part
    finally:
        sock.close()
    assert answer.startswith(b"HTTP/1.1 408") and b"did not arrive within 1 s" in answer


def test_a_client_that_stops_reading_loses_its_slot(loop_server):
    body = json.dumps({"model": "loop.gguf", "stream": True, "max_tokens": 30000,
                       "messages": [{"role": "user", "content": "go"}]}).encode()
    sock = connect(loop_server, rcvbuf=4096)
    try:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        assert sock.recv(1024).startswith(b"HTTP/1.1 200")  # the stream began; now nothing more is read
        for _ in range(600):  # bounded: the send buffers fill, then the stall timeout (1 s) runs out
            if metric(loop_server, "tallow_requests_total", finish_reason="cancelled") >= 1:
                break
            time.sleep(0.1)
        assert metric(loop_server, "tallow_requests_total", finish_reason="cancelled") == 1
        assert metric(loop_server, "tallow_slots_busy") == 0
        assert metric(loop_server, "tallow_completion_tokens_total") < 30000
    finally:
        sock.close()
    # the slot serves the next client
    status, _, answer = loop_server.raw("/v1/chat/completions", json.dumps({
        "model": "loop.gguf", "max_tokens": 4, "messages": [{"role": "user", "content": "go"}]}).encode(),
        {"Content-Type": "application/json"})
    assert status == 200 and answer["usage"]["completion_tokens"] == 4


def test_one_address_may_hold_only_so_many_requests(tmp_path):
    import http.client
    import threading

    model = write_synthetic_gguf(tmp_path / "loop.gguf", script={"\n": "a", "a": "b", "b": "a"}, ctx_train=32768)
    s = Server(model, tmp_path, "--ctx", "32768", "--parallel", "2", "--max-tokens", "30000", "--max-per-client", "2")
    host, port = s.url.removeprefix("http://").rsplit(":", 1)
    body = json.dumps({"model": "loop.gguf", "stream": True, "max_tokens": 30000,
                       "messages": [{"role": "user", "content": "go"}]})
    open_streams = []
    try:
        for _ in range(2):  # two streams held open by this address
            c = http.client.HTTPConnection(host, int(port), timeout=60)
            c.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
            r = c.getresponse()
            assert r.status == 200 and r.read(64)
            open_streams.append(c)
        status, headers, answer = s.raw("/v1/models")
        assert status == 429 and headers["Retry-After"] == "1" and "--max-per-client" in answer["error"]["message"]
        open_streams.pop().close()  # one stream ends: the address may ask again
        for _ in range(100):
            if s.raw("/v1/models")[0] == 200:
                break
            threading.Event().wait(0.1)
        assert s.raw("/v1/models")[0] == 200
    finally:
        for c in open_streams:
            c.close()
        s.close()


def test_a_client_that_trickles_its_headers_is_cut_off(synth_model, tmp_path):
    s = Server(synth_model, tmp_path, "--header-timeout", "1")
    try:
        quiet = connect(s)  # connects and says nothing
        slow = connect(s)
        slow.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # and never finishes
        for sock in (quiet, slow):
            assert sock.recv(1024) == b""  # closed by the server (the client's own 30 s timeout would raise)
        # a client that sends its headers in time is served, on the same kind of connection
        status, _, _ = s.raw("/v1/models")
        assert status == 200
    finally:
        s.close()
