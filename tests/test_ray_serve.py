"""tallow serve --ray on a real Ray cluster of this machine (a head and two worker nodes of
one CPU each, on 127.0.0.1): the default model as a Ray Serve application of two replicas,
answered through Ray Serve's proxy by the official clients; requests sharing a prefix meet
one replica's cache; SIGTERM lets a stream in flight finish, then the command exits 0."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
from helpers.processes import tallow_env

pytest.importorskip("ray")

from helpers.ray_cluster import LoopbackCluster  # noqa: E402 - sets Ray's environment first

pytestmark = [pytest.mark.slow, pytest.mark.default_model]  # a Ray cluster and Ray Serve


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    def __init__(self, home) -> None:
        self.cluster = LoopbackCluster(workers=2)
        self.port = _free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tallow.cli", "serve", "smollm2:135m", "--ray", self.cluster.address,
             "--ray-replicas", "2", "--port", str(self.port), "--parallel", "4", "--offline"],
            env=tallow_env(home), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self.serving = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        if not self.serving.wait(300):
            self.close()
            pytest.fail("serve --ray did not start:\n" + "".join(self.lines))
        self.url = f"http://127.0.0.1:{self.port}"

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.append(line)
            if line.startswith("serving "):
                self.serving.set()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.cluster.shutdown()


@pytest.fixture(scope="module")
def served(default_home):
    s = Served(default_home)
    try:
        yield s
    finally:
        s.close()


def test_the_clients_are_answered_through_ray_serve(served):
    import anthropic
    import openai

    assert "2 replicas of 1 CPU" in "".join(served.lines)
    client = openai.OpenAI(base_url=served.url + "/v1", api_key="none", max_retries=0)
    ask = {"model": "smollm2:135m", "messages": [{"role": "user", "content": "Name a primary colour."}],
           "max_tokens": 12, "temperature": 0}
    whole = client.chat.completions.create(**ask)
    assert whole.usage.completion_tokens > 0 and whole.choices[0].message.content
    pieces, usage = [], None
    for chunk in client.chat.completions.create(**ask, stream=True, stream_options={"include_usage": True}):
        pieces += [c.delta.content or "" for c in chunk.choices]
        usage = chunk.usage or usage
    assert "".join(pieces) == whole.choices[0].message.content
    assert usage.completion_tokens == whole.usage.completion_tokens
    said = anthropic.Anthropic(base_url=served.url, api_key="none", max_retries=0).messages.create(
        model="smollm2:135m", max_tokens=12, extra_body={"temperature": 0},
        messages=[{"role": "user", "content": "Name a primary colour."}])
    assert said.content[0].text == whole.choices[0].message.content
    health = client.with_options(base_url=served.url).get("/health", cast_to=object)
    assert health["status"] == "ok"


def test_requests_sharing_a_prefix_meet_one_replicas_cache(served):
    import openai

    client = openai.OpenAI(base_url=served.url + "/v1", api_key="none", max_retries=0)
    system = "You answer questions about the city library's opening hours and loans. " * 12
    cached = []
    for i in range(8):
        got = client.chat.completions.create(model="smollm2:135m", max_tokens=2, temperature=0, messages=[
            {"role": "system", "content": system}, {"role": "user", "content": f"Question {i}: when do you open?"}])
        cached.append((got.usage.prompt_tokens_details.cached_tokens, got.usage.prompt_tokens))
    # The first met a cold replica; with two replicas and no affinity, each later request
    # would have a 1 in 2 chance of a replica that never saw the prefix.
    assert all(c >= 0.8 * (p - 12) for c, p in cached[1:]), cached


def test_sigterm_lets_the_stream_in_flight_finish(served):
    import openai

    client = openai.OpenAI(base_url=served.url + "/v1", api_key="none", max_retries=0)
    stream = client.chat.completions.create(model="smollm2:135m", max_tokens=120, temperature=0, stream=True,
                                            stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
                                            messages=[{"role": "user", "content": "Tell me a long story."}])
    usage, finish, signalled = None, None, False
    for chunk in stream:
        if not signalled and any(c.delta.content for c in chunk.choices):
            served.proc.send_signal(signal.SIGTERM)
            signalled = True
        finish = next((c.finish_reason for c in chunk.choices if c.finish_reason), finish)
        usage = chunk.usage or usage
    assert signalled and finish == "length" and usage.completion_tokens == 120
    started = time.monotonic()
    assert served.proc.wait(120) == 0, "".join(served.lines)
    assert time.monotonic() - started < 120
    assert any("draining" in line for line in served.lines)
