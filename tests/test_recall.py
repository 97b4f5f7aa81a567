"""Recall drafts: a lookup drafter that finds nothing in its own request drafts from what
earlier requests of the same tenant wrote (runtime/drafting/recall.py), on the engine's
route and the scheduler's, never from another tenant's, and never changing an answer."""

from __future__ import annotations

import string

import pytest

from tallow.runtime.drafting.recall import NGRAM, Memory, Recall
from tallow.runtime.types import FinalEvent, LoadSettings, Request, Sampling, SchedulerSettings, TokenEvent

GREEDY = Sampling(temperature=0)
ALPHABET = "\n" + string.ascii_lowercase  # the scripted model writes the alphabet after a newline


def test_memory_finds_what_followed_in_an_earlier_request():
    memory = Memory(budget=100)
    first = memory.open()
    memory.append(first, [1, 2, 3, 4, 5, 6, 7])
    memory.append(memory.open(), [9, 9, 9])
    assert memory.continuation([0, 1, 2, 3, 4], 2) == [5, 6]
    assert memory.continuation([8, 2, 3, 4], 9) == []  # all four tokens must match
    assert memory.continuation([1, 2, 3], 2) == []  # fewer than NGRAM tokens of context
    assert NGRAM == 4


def test_memory_forgets_the_oldest_requests_and_keeps_its_index_bounded():
    memory = Memory(budget=50)
    for start in range(0, 1000, 10):
        memory.append(memory.open(), list(range(start, start + 10)))
    assert memory.size <= 50 and len(memory.docs) == 5
    assert len(memory.index) <= 2 * 50
    assert memory.continuation([990, 991, 992, 993], 3) == [994, 995, 996]  # the newest is remembered
    assert memory.continuation([0, 1, 2, 3], 3) == []  # the oldest is not
    one = memory.open()
    memory.append(one, list(range(5000, 5200)))  # longer than the whole memory: its beginning is kept
    assert len(memory.docs[one]) == 50 and memory.size <= 50


def test_recall_keeps_a_memory_per_tenant_and_forgets_the_least_recently_used():
    recall = Recall(budget=10, scopes=2)
    a, b = recall.memory("a"), recall.memory("b")
    assert a is not b and recall.memory("a") is a
    recall.memory("c")  # "b" was used longest ago
    assert set(recall.memories) == {"a", "c"}
    assert Recall(budget=0).memory("a") is None


@pytest.fixture(scope="module")
def alphabet_model(tmp_path_factory):
    from helpers.synth import write_synthetic_gguf

    script = {ALPHABET[i]: ALPHABET[i + 1] for i in range(len(ALPHABET) - 1)}
    return write_synthetic_gguf(tmp_path_factory.mktemp("recall") / "alphabet.gguf", script=script)


def _request(model_or_engine, text: str, tenant: str | None, draft: str | None = "lookup") -> Request:
    tokens = model_or_engine.tokenize(text)
    return Request(tokens, 20, sampling=GREEDY, draft=draft, tenant=tenant)


def _collect(events) -> tuple[str, FinalEvent]:
    events = list(events)
    final = events[-1]
    assert isinstance(final, FinalEvent)
    return "".join(e.text for e in events if isinstance(e, TokenEvent)), final


def test_engine_drafts_from_an_earlier_request_of_the_same_tenant_only(alphabet_model):
    from tallow.runtime.engine import Engine

    with Engine(alphabet_model, LoadSettings(n_ctx=512, n_threads=2)) as engine:
        plain, _ = _collect(engine.stream(_request(engine, "hello\n", "alice", draft=None)))
        assert plain == string.ascii_lowercase[:20]  # nothing in it repeats: its own lookup has nothing
        text, first = _collect(engine.stream(_request(engine, "hello\n", "alice")))
        assert text == plain and first.usage.draft_tokens == 0
        text, again = _collect(engine.stream(_request(engine, "world\n", "alice")))  # a fresh prompt
        assert text == plain and again.usage.accepted_tokens >= 12
        assert again.usage.accepted_tokens == again.usage.draft_tokens and again.usage.draft == "lookup"
        text, other = _collect(engine.stream(_request(engine, "world\n", "bob")))
        assert text == plain and other.usage.draft_tokens == 0  # alice's answers are not bob's drafts
    with Engine(alphabet_model, LoadSettings(n_ctx=512, n_threads=2, recall=0)) as engine:
        for prompt in ("hello\n", "world\n"):
            text, off = _collect(engine.stream(_request(engine, prompt, "alice")))
            assert text == plain and off.usage.draft_tokens == 0


def test_scheduler_slots_draft_from_what_other_slots_wrote(alphabet_model):
    from tallow.runtime.scheduling.scheduler import Scheduler

    sched = Scheduler.load([alphabet_model], LoadSettings(n_ctx=2048, n_threads=2), SchedulerSettings(parallel=2))
    try:
        first = _collect(sched.submit(_request(sched.engine, "one\n", None)).events())
        second = _collect(sched.submit(_request(sched.engine, "two\n", None)).events())
        other = _collect(sched.submit(_request(sched.engine, "two\n", "carol")).events())
    finally:
        sched.close()
    assert first[0] == second[0] == other[0] == string.ascii_lowercase[:20]
    assert first[1].usage.draft_tokens == 0 and second[1].usage.accepted_tokens >= 12
    assert other[1].usage.draft_tokens == 0


@pytest.mark.slow
def test_serve_drafts_from_the_same_keys_answers_only(alphabet_model, tmp_path):
    # the tenant is the API key's name, set by serve's front: one key's answers never draft another's
    openai = pytest.importorskip("openai")
    from helpers.processes import run_tallow
    from helpers.server import Server

    keys = {}
    for name in ("alice", "bob"):
        made = run_tallow(["keys", "create", name], home=tmp_path)
        assert made.returncode == 0, made.stderr.decode()
        keys[name] = made.stdout.decode().strip()
    server = Server(alphabet_model, tmp_path, "--auth", "keys")
    try:
        def complete(key: str, prompt: str):
            client = openai.OpenAI(base_url=server.url + "/v1", api_key=keys[key], max_retries=0, timeout=60)
            r = client.completions.create(model=alphabet_model.name, prompt=prompt, max_tokens=20, temperature=0,
                                          extra_body={"draft": "lookup"})
            return r.choices[0].text, r.usage.model_extra or {}

        first, seen = complete("alice", "hello\n")
        again, used = complete("alice", "world\n")
        other, unseen = complete("bob", "world\n")
    finally:
        server.close()
    assert first == again == other == string.ascii_lowercase[:20]
    assert seen.get("draft_tokens", 0) == 0 and unseen.get("draft_tokens", 0) == 0
    assert used["accepted_tokens"] >= 12
