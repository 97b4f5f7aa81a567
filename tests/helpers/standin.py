"""A stand-in OpenAI-compatible server on loopback, for what a real replica will not do on
demand: omit usage, refuse with 429 or 500, drop the connection mid-stream. It records every
request body it gets. Bounded: it serves until `close()`, and every answer is a few chunks."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class StandIn:
    def __init__(self, usage: bool = True, words: tuple[str, ...] = ("Hello", " from", " the", " stand-in"),
                 gap_s: float = 0.01) -> None:
        self.usage, self.words, self.gap_s = usage, words, gap_s
        self.bodies: list[dict] = []
        self.fail_next: list[int] = []  # statuses to answer the next requests with (429, 500, ...); 0: drop mid-stream
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                with outer.lock:
                    outer.bodies.append(body)
                    fail = outer.fail_next.pop(0) if outer.fail_next else None
                if fail:
                    data = json.dumps({"error": {"message": f"stand-in says {fail}"}}).encode()
                    self.send_response(fail)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    if fail == 429:
                        self.send_header("Retry-After", "0")
                    self.end_headers()
                    self.wfile.write(data)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                chat = "messages" in body
                for i, word in enumerate(outer.words):
                    if fail == 0 and i == 2:
                        self.wfile.flush()
                        self.connection.shutdown(2)  # the connection is lost mid-answer
                        return
                    choice = {"index": 0, "delta": {"content": word}} if chat else {"index": 0, "text": word}
                    self.chunk({"id": "x", "model": body.get("model"), "choices": [{**choice, "finish_reason": None}]})
                    time.sleep(outer.gap_s)
                last = {"index": 0, "delta": {}} if chat else {"index": 0, "text": ""}
                self.chunk({"id": "x", "model": body.get("model"), "choices": [{**last, "finish_reason": "stop"}]})
                if outer.usage:
                    self.chunk({"id": "x", "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 4,
                                                                     "total_tokens": 11}})
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()

            def chunk(self, obj: dict) -> None:
                self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
                self.wfile.flush()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
