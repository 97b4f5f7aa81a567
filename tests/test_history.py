"""The history log: migrations, logging from run, `tallow logs`, --continue, and a broken database."""

from __future__ import annotations

import json
import sqlite3

import pytest
from helpers.processes import run_tallow
from helpers.synth import write_synthetic_gguf

from tallow.runtime.history import MIGRATIONS, History, migrate
from tallow.runtime.types import FinalEvent, Timings, Usage

THINK_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n<think>\\n' }}{% endif %}{# </think> #}"
)


@pytest.fixture(scope="module")
def think_model(tmp_path_factory):
    script = {"\n": "h", "h": "m", "m": "</think>", "</think>": "O", "O": "K", "K": "<|im_end|>"}
    return write_synthetic_gguf(tmp_path_factory.mktemp("think") / "think.gguf", script=script, template=THINK_TEMPLATE)


def test_migrations_apply_once_in_order():
    db = sqlite3.connect(":memory:")
    assert migrate(db) == [m.__name__ for m in MIGRATIONS]
    assert migrate(db) == []
    cols = {row[1] for row in db.execute("PRAGMA table_info(responses)")}
    assert {"prompt", "response", "reasoning", "reasoning_tokens", "conversation_id", "draft", "accepted_tokens"} <= cols


def test_a_database_from_an_older_version_is_upgraded():
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE _migrations (name TEXT PRIMARY KEY, applied REAL NOT NULL)")
    MIGRATIONS[0](db)
    db.execute("INSERT INTO _migrations VALUES ('m001_initial', 0)")
    assert migrate(db) == ["m002_reasoning", "m003_api_responses", "m004_drafts", "m005_conversation_titles",
                            "m006_keys_and_usage", "m007_audio_usage", "m008_usage_request"]


def test_log_and_query():
    h = History(":memory:")
    final = FinalEvent("blue", "stop", Usage(10, 0, 2), Timings())
    h.log("c1", "m", "sys", "why is the sky blue?", final)
    h.log("c1", "m", "sys", "and the sea?", FinalEvent("also blue", "stop", Usage(20, 14, 3), Timings()))
    h.log("c2", "m", None, "other", final)
    assert [t.prompt for t in h.turns(limit=2)] == ["other", "and the sea?"]
    assert [t.prompt for t in h.turns(query="sea")] == ["and the sea?"]
    system, messages, model = h.messages("c1")
    assert system == "sys" and model == "m"
    assert messages == [{"role": "user", "content": "why is the sky blue?"}, {"role": "assistant", "content": "blue"},
                        {"role": "user", "content": "and the sea?"}, {"role": "assistant", "content": "also blue"}]
    assert h.latest_conversation() == "c2"


def test_run_logs_continues_and_reports_reasoning(think_model, tmp_path):
    home = tmp_path / "home"
    first = run_tallow(["run", str(think_model), "hi", "--json", "--temperature", "0"], home=home)
    assert first.returncode == 0, first.stderr.decode()
    data = json.loads(first.stdout)
    assert data["text"] == "OK" and data["reasoning"] == "hm" and data["usage"]["reasoning_tokens"] == 3
    plain = run_tallow(["run", str(think_model), "hi", "--temperature", "0", "--no-log"], home=home)
    assert plain.stdout == b"OK\n"  # reasoning is not part of the answer on stdout

    logged = json.loads(run_tallow(["logs", "--json", "-n", "0"], home=home).stdout)
    assert len(logged) == 1 and logged[0]["prompt"] == "hi" and logged[0]["reasoning"] == "hm"
    cid = logged[0]["conversation_id"]

    again = json.loads(run_tallow(["run", str(think_model), "more", "--json", "-c", "--temperature", "0"], home=home).stdout)
    assert again["conversation_id"] == cid
    assert again["usage"]["cached_tokens"] == 0  # a new process: the first turn is a full prefill
    assert again["usage"]["prompt_tokens"] > data["usage"]["prompt_tokens"]
    turns = json.loads(run_tallow(["logs", "--json", "--cid", cid, "-n", "0"], home=home).stdout)
    assert [t["prompt"] for t in turns] == ["more", "hi"]
    assert json.loads(run_tallow(["logs", "--json", "-q", "more"], home=home).stdout)[0]["prompt"] == "more"
    assert run_tallow(["logs", "path"], home=home).stdout.decode().strip() == str(home / "history.db")
    text = run_tallow(["logs", "-n", "1"], home=home).stdout.decode()
    assert "> more" in text and cid in text


def test_logging_off_and_on(think_model, tmp_path):
    home = tmp_path / "home"
    assert run_tallow(["logs", "off"], home=home).returncode == 0
    run_tallow(["run", str(think_model), "one"], home=home)
    assert run_tallow(["run", str(think_model), "two"], home=home, env={"TALLOW_NO_LOG": "1"}).returncode == 0
    assert not (home / "history.db").exists()
    assert run_tallow(["logs", "on"], home=home).returncode == 0
    run_tallow(["run", str(think_model), "three"], home=home)
    assert [t["prompt"] for t in json.loads(run_tallow(["logs", "--json"], home=home).stdout)] == ["three"]
    r = run_tallow(["run", str(think_model), "x", "-c"], home=tmp_path / "empty")
    assert r.returncode == 1 and b"no logged conversation" in r.stderr


def test_a_broken_or_locked_database_never_costs_the_answer(think_model, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "history.db").write_bytes(b"this is not a database" * 100)
    r = run_tallow(["run", str(think_model), "hi", "--temperature", "0"], home=home)
    assert r.returncode == 0 and r.stdout == b"OK\n"
    assert b"warning: history log unavailable" in r.stderr
    logs = run_tallow(["logs"], home=home)
    assert logs.returncode == 1 and b"cannot be read" in logs.stderr and b"Traceback" not in logs.stderr

    home2 = tmp_path / "home2"
    assert run_tallow(["run", str(think_model), "first"], home=home2).returncode == 0
    locker = sqlite3.connect(str(home2 / "history.db"))
    locker.execute("BEGIN EXCLUSIVE")
    try:
        r = run_tallow(["run", str(think_model), "while locked", "--temperature", "0"], home=home2)
    finally:
        locker.rollback()
        locker.close()
    assert r.returncode == 0 and r.stdout == b"OK\n"
    assert b"warning:" in r.stderr
