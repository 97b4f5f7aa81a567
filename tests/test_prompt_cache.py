"""The prompt cache on disk: reuse across processes, integrity, fingerprints, eviction."""

from __future__ import annotations

import json

import pytest
from helpers.processes import run_tallow

from tallow.runtime.engine import Engine
from tallow.runtime.prompt_cache import PromptCache
from tallow.runtime.types import FinalEvent, LoadSettings, Sampling

WILD = Sampling(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=11)


def answer(engine, request) -> FinalEvent:
    final = [e for e in engine.stream(request) if isinstance(e, FinalEvent)][0]
    engine.save_prompt(request)
    return final


def fresh(path, cache, n_ctx=512) -> Engine:
    """A new engine on the same file: as far as the KV cache goes, another process."""
    engine = Engine(path, LoadSettings(n_ctx=n_ctx, n_threads=2))
    engine.use_prompt_cache(cache, "synthetic-digest")
    return engine


def long_messages(question: str) -> list[dict]:
    doc = " ".join(f"line {i} of a document worth caching." for i in range(5))
    return [{"role": "system", "content": "You answer questions about documents."},
            {"role": "user", "content": f"{doc}\n\n{question}"}]


def test_a_later_process_prefills_only_what_follows_the_saved_prefix(synth_model, tmp_path):
    cache = PromptCache(tmp_path / "cache", 1 << 30, min_tokens=16)
    with fresh(synth_model, cache) as first:
        req = first.request(long_messages("What is line 3?"), max_tokens=40, sampling=WILD)
        a = answer(first, req)
    assert a.usage.cached_tokens == 0 and a.usage.cache_source is None
    assert cache.stats()["entries"] == 1
    with fresh(synth_model, cache) as second:
        req2 = second.request(long_messages("What is line 3?"), max_tokens=40, sampling=WILD)
        b = answer(second, req2)
    assert b.usage.cache_source == "disk"
    assert b.usage.cached_tokens == len(req2.prompt_tokens) - 1 and b.timings.prefill_tokens == 1
    assert b.text == a.text  # identical answers with the same seed


def test_cache_points_serve_a_different_question(synth_model, tmp_path):
    cache = PromptCache(tmp_path / "cache", 1 << 30, min_tokens=16)
    system_only = [long_messages("")[0]]
    with fresh(synth_model, cache) as engine:
        req = engine.request(long_messages("first?"), cache_prefixes=[system_only], max_tokens=4, sampling=WILD)
        answer(engine, req)
    assert cache.stats()["entries"] == 2  # the system prompt... and the whole prompt
    with fresh(synth_model, cache) as engine:
        other = engine.request(long_messages("a different question, quite unlike the first"), max_tokens=4, sampling=WILD)
        final = answer(engine, other)
    # the saved whole prompt ends with "first?": the longest match is the shared document
    assert final.usage.cache_source == "disk"
    assert 16 <= final.usage.cached_tokens < len(other.prompt_tokens) - 5


@pytest.mark.parametrize("damage", ["flip", "truncate", "record"])
def test_a_damaged_entry_is_removed_never_loaded(synth_model, tmp_path, damage):
    cache = PromptCache(tmp_path / "cache", 1 << 30, min_tokens=16)
    with fresh(synth_model, cache) as engine:
        req = engine.request(long_messages("q"), max_tokens=20, sampling=WILD)
        good = answer(engine, req)
    entry = cache.entries()[0]
    data = bytearray(entry.state_path.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0xFF
        entry.state_path.write_bytes(bytes(data))
    elif damage == "truncate":
        entry.state_path.write_bytes(bytes(data[: len(data) // 2]))
    else:
        entry.record_path.write_text("{not json")
    with fresh(synth_model, cache) as engine:
        final = answer(engine, engine.request(long_messages("q"), max_tokens=20, sampling=WILD))
    assert final.usage.cached_tokens == 0 and final.text == good.text
    assert len(cache.entries()) == 1  # the damaged entry went; this run saved a good one
    assert cache.verify(cache.entries()[0])


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_after_a_damaged_entry_the_next_best_one_is_loaded(synth_model, tmp_path, damage):
    cache = PromptCache(tmp_path / "cache", 1 << 30, min_tokens=16)
    system_only = [long_messages("")[0]]
    with fresh(synth_model, cache) as engine:
        req = engine.request(long_messages("q"), cache_prefixes=[system_only], max_tokens=4, sampling=WILD)
        answer(engine, req)
    longest, shorter = sorted(cache.entries(), key=lambda e: len(e.tokens), reverse=True)
    data = bytearray(longest.state_path.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0xFF
    else:
        del data[len(data) // 2:]
    longest.state_path.write_bytes(bytes(data))
    with fresh(synth_model, cache) as engine:
        final = answer(engine, engine.request(long_messages("q"), max_tokens=4, sampling=WILD))
    assert final.usage.cache_source == "disk"
    assert final.usage.cached_tokens == len(shorter.tokens)  # not zero: the shorter entry served
    assert {len(e.tokens) for e in cache.entries()} == {len(longest.tokens), len(shorter.tokens)}
    assert all(cache.verify(e) for e in cache.entries())  # the damaged one went, this run saved it anew


def test_a_different_context_never_loads_the_state(synth_model, tmp_path):
    cache = PromptCache(tmp_path / "cache", 1 << 30, min_tokens=16)
    with fresh(synth_model, cache, n_ctx=512) as engine:
        answer(engine, engine.request(long_messages("q"), max_tokens=4, sampling=WILD))
    with fresh(synth_model, cache, n_ctx=1024) as engine:
        final = answer(engine, engine.request(long_messages("q"), max_tokens=4, sampling=WILD))
    assert final.usage.cached_tokens == 0
    assert cache.stats()["fingerprints"] == 2


def test_least_recently_used_entries_are_evicted_past_the_cap(synth_model, tmp_path):
    cache = PromptCache(tmp_path / "cache", 1 << 30, min_tokens=16)
    with fresh(synth_model, cache) as engine:
        for q in ("one", "two", "three"):
            engine.reset()
            answer(engine, engine.request(long_messages(q), max_tokens=2, sampling=WILD))
    entries = sorted(cache.entries(), key=lambda e: e.last_used)
    assert len(entries) == 3
    cache.max_bytes = entries[1].size + entries[2].size  # room for the two most recent
    gone = cache.evict()
    assert [e.key for e in gone] == [entries[0].key]
    assert {e.key for e in cache.entries()} == {entries[1].key, entries[2].key}


def test_cli_cache_commands_and_no_cache(synth_model, tmp_path):
    home = tmp_path / "home"
    env = {"TALLOW_CACHE_MIN_TOKENS": "16"}
    doc = " ".join(f"sentence {i} of a piped document." for i in range(6)).encode()
    args = ["run", str(synth_model), "summarize", "-n", "5", "--json", "--temperature", "0"]
    first = json.loads(run_tallow(args, home=home, input=doc, env=env).stdout)
    second = json.loads(run_tallow(args, home=home, input=doc, env=env).stdout)
    assert second["usage"]["cache_source"] == "disk" and second["text"] == first["text"]
    other = json.loads(run_tallow(["run", str(synth_model), "another question", "-n", "5", "--json"], home=home,
                                  input=doc, env=env).stdout)
    assert other["usage"]["cache_source"] == "disk"  # the document's own prefix was saved too
    stats = json.loads(run_tallow(["cache", "stats", "--json"], home=home, env=env).stdout)
    assert stats["entries"] >= 2 and stats["bytes"] > 0
    assert len(json.loads(run_tallow(["cache", "ls", "--json"], home=home).stdout)) == stats["entries"]
    bypass = json.loads(run_tallow([*args, "--no-cache"], home=home, input=doc, env=env).stdout)
    assert bypass["usage"]["cached_tokens"] == 0
    assert run_tallow(["cache", "clear"], home=home).returncode == 0
    assert json.loads(run_tallow(["cache", "stats", "--json"], home=home).stdout)["entries"] == 0
    bad = run_tallow(args, home=home, input=doc, env={"TALLOW_CACHE_MAX": "lots"})
    assert bad.returncode == 1 and b"TALLOW_CACHE_MAX" in bad.stderr
