"""A seed gives one answer whatever the cache holds and whatever else is decoding: the same
request at temperature 1 with a seed, on a fresh server (cold), again (warm from memory), on
a restarted server (warm from disk), and beside two other streams, on chat completions, text
completions, Messages and Ollama's chat. Without batch-invariant packing for seeded requests
the cold answer differed from the warm ones (runtime/scheduling/step_calls.py)."""

from __future__ import annotations

import threading

import pytest
from helpers.server import Server

pytestmark = [pytest.mark.default_model, pytest.mark.slow]

SYSTEM = "You are a storyteller who writes short, vivid tales for children. " * 6
CHAT = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Tell me a story about a fox."}]


def _routes(server):
    import anthropic
    import ollama

    client = server.client()
    claude = anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0)
    llama = ollama.Client(host=server.url)
    return {
        "chat": lambda: client.chat.completions.create(model="tallow", messages=CHAT, max_tokens=32, temperature=1.0,
                                                       seed=42).choices[0].message.content,
        "completions": lambda: client.completions.create(model="tallow", prompt=SYSTEM + "Once upon a time", max_tokens=32,
                                                         temperature=1.0, seed=42).choices[0].text,
        "messages": lambda: claude.messages.create(model="tallow", system=SYSTEM, max_tokens=32, messages=CHAT[1:],
                                                   extra_body={"temperature": 1.0, "seed": 42}).content[0].text,
        "ollama": lambda: llama.chat(model="tallow", messages=CHAT, options={"temperature": 1.0, "seed": 42,
                                                                           "num_predict": 32}).message.content,
    }


def _busy(server, stop: threading.Event) -> list[threading.Thread]:
    """Two other streams decoding for as long as `stop` is not set."""
    def run() -> None:
        client = server.client()
        while not stop.is_set():
            for _ in client.chat.completions.create(model="tallow", stream=True, max_tokens=64, temperature=0.7,
                                                    messages=[{"role": "user", "content": "Describe the sea."}]):
                if stop.is_set():
                    break
    threads = [threading.Thread(target=run, daemon=True) for _ in range(2)]
    for t in threads:
        t.start()
    return threads


def test_a_seed_gives_one_answer_cold_warm_from_disk_and_beside_other_streams(default_model, tmp_path):
    home = tmp_path / "home"
    first = Server(default_model, home, "--parallel", "4")
    try:
        routes = _routes(first)
        cold = {name: ask() for name, ask in routes.items()}
        warm = {name: ask() for name, ask in routes.items()}
        stop = threading.Event()
        neighbours = _busy(first, stop)
        try:
            beside = {name: ask() for name, ask in routes.items()}
        finally:
            stop.set()
            for t in neighbours:  # their streams end before the server does: no request meets its shutdown
                t.join(timeout=120)
    finally:
        first.close()
    second = Server(default_model, home, "--parallel", "4")
    try:
        disk = {name: ask() for name, ask in _routes(second).items()}
    finally:
        second.close()
    assert all(cold.values()), cold
    assert warm == cold, (cold, warm)
    assert beside == cold, (cold, beside)
    assert disk == cold, (cold, disk)
