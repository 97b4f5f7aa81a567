"""Several answers from one prompt: forks start from a copy of their leader's cells
(Scheduler.submit's fork_of), so the prompt is evaluated once; each fork samples with its
own seed and answers as that request alone would."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tallow.runtime.scheduling.scheduler import Scheduler
from tallow.runtime.types import FinalEvent, LoadSettings, Request, Sampling, SchedulerSettings, TokenEvent

PROMPT = "alpha beta gamma delta omega sigma tau rho " * 6


@pytest.fixture(scope="module")
def sched(synth_model):
    s = Scheduler.load([synth_model], LoadSettings(n_ctx=4096, n_threads=2),
                       SchedulerSettings(parallel=4, deterministic=True))
    yield s
    s.close()


def answer(handle) -> tuple[list[int], FinalEvent]:
    tokens, final = [], None
    for ev in handle.events():
        if isinstance(ev, TokenEvent):
            tokens.append(ev.token)
        else:
            final = ev
    assert final is not None
    return tokens, final


def four(sched, prompt: str) -> list[Request]:
    tokens = sched.engine.prompt_for([{"role": "user", "content": prompt}])
    return [Request(tokens, 24, sampling=Sampling(temperature=0.8, seed=seed), ignore_eos=True)
            for seed in (1, 2, 3, 4)]


def test_forks_answer_as_separate_requests_with_one_prefill(sched):
    reqs = four(sched, PROMPT)
    apart = [answer(sched.submit(r)) for r in reqs]
    for slot in sched.slots:  # nothing cached: the forks' leader evaluates the whole prompt
        slot.sequence.clear()
    leader = sched.submit(reqs[0])
    handles = [leader] + [sched.submit(r, fork_of=leader) for r in reqs[1:]]
    forked = [answer(h) for h in handles]
    n = len(reqs[0].prompt_tokens)
    assert [t for t, _ in forked] == [t for t, _ in apart]
    assert len({tuple(t) for t, _ in forked}) == 4  # four seeds, four answers
    first = forked[0][1]
    assert first.usage.cached_tokens == 0 and first.timings.prefill_tokens == n
    for _, final in forked[1:]:  # each fork evaluates only the last prompt token, for its own logits
        assert final.usage.cached_tokens == n - 1 and final.timings.prefill_tokens == 1


def test_a_fork_whose_leader_ended_still_answers(sched):
    reqs = four(sched, PROMPT + "again")
    for slot in sched.slots:
        slot.sequence.clear()
    leader = sched.submit(replace(reqs[0], max_tokens=1))
    fork = sched.submit(reqs[1], fork_of=leader)
    answer(leader)
    tokens, final = answer(fork)
    assert len(tokens) == 24 and final.usage.cached_tokens == len(reqs[1].prompt_tokens) - 1


@pytest.fixture(scope="module")
def server(synth_model, tmp_path_factory):
    pytest.importorskip("openai")
    from helpers.server import Server

    s = Server(synth_model, tmp_path_factory.mktemp("fork-home"), "--parallel", "4", "--deterministic")
    yield s
    s.close()


ASK = [{"role": "user", "content": PROMPT}]


def test_n_choices_through_the_openai_client(server, synth_model):
    client = server.client()
    kw = dict(model=synth_model.name, messages=ASK, max_tokens=12, temperature=0.8, seed=7)
    whole = client.chat.completions.create(n=4, **kw)
    again = client.chat.completions.create(n=4, **kw)
    texts = [c.message.content for c in whole.choices]
    assert [c.index for c in whole.choices] == [0, 1, 2, 3] and len(set(texts)) == 4
    assert [c.message.content for c in again.choices] == texts  # reproducible with a seed
    one = client.chat.completions.create(n=1, **{**kw, "seed": 9})
    assert one.choices[0].message.content == texts[2]  # choice i samples with seed + i
    # the usage counts the prompt once and the completions of all four
    assert whole.usage.completion_tokens == 48 and whole.usage.prompt_tokens == one.usage.prompt_tokens

    streamed: dict[int, str] = {}
    finishes: dict[int, str] = {}
    usage = None
    for chunk in client.chat.completions.create(n=4, stream=True, stream_options={"include_usage": True}, **kw):
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            streamed[c.index] = streamed.get(c.index, "") + (c.delta.content or "")
            if c.finish_reason:
                finishes[c.index] = c.finish_reason
    assert [streamed[i] for i in range(4)] == texts and finishes == {i: "length" for i in range(4)}
    assert usage is not None and usage.completion_tokens == 48


def cached_total(server) -> int:
    page = server.raw("/metrics")[2]
    return int(float(next(line.split()[-1] for line in page.splitlines()
                          if line.startswith("tallow_cached_prompt_tokens_total"))))


def test_the_prompt_is_evaluated_once(server, synth_model):
    before = cached_total(server)
    r = server.client().chat.completions.create(model=synth_model.name, max_tokens=4, n=4, temperature=0.8,
                                                messages=[{"role": "user", "content": "a prompt never seen " * 5}])
    # the first choice evaluates it; the three forks copy its cells and evaluate one token each
    leader = r.usage.prompt_tokens_details.cached_tokens  # the chat template's opening, cached before
    assert leader < 10 and cached_total(server) - before == leader + 3 * (r.usage.prompt_tokens - 1)


def test_n_on_text_completions(server, synth_model):
    r = server.client().completions.create(model=synth_model.name, prompt=PROMPT, n=3, max_tokens=6, temperature=0.8,
                                           seed=3)
    assert [c.index for c in r.choices] == [0, 1, 2] and len({c.text for c in r.choices}) > 1


def test_batch_lines_with_n(synth_model, tmp_path):
    import json

    from helpers.processes import run_tallow

    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    line = {"messages": ASK, "max_tokens": 8, "temperature": 0.8, "seed": 5, "ignore_eos": True}
    src.write_text(json.dumps({"id": "three", "n": 3, **line}) + "\n" + json.dumps({"id": "one", **line}) + "\n")
    r = run_tallow(["batch", str(src), "-o", str(out), "--model", str(synth_model), "--parallel", "4",
                    "--deterministic"], home=tmp_path)
    assert r.returncode == 0, r.stderr.decode()
    records = {rec["id"]: rec for rec in map(json.loads, out.read_text().splitlines())}
    three, one = records["three"], records["one"]
    assert [c["index"] for c in three["choices"]] == [0, 1, 2] and len({c["text"] for c in three["choices"]}) == 3
    assert three["choices"][0]["text"] == one["text"]  # choice 0 is the line's own answer
    assert three["usage"]["completion_tokens"] == 24 and three["usage"]["prompt_tokens"] == one["usage"]["prompt_tokens"]
    assert all(c["finish_reason"] == "length" for c in three["choices"])
    refused = run_tallow(["batch", str(src), "-o", str(tmp_path / "fleet.jsonl"), "--endpoint", "http://127.0.0.1:9"],
                         home=tmp_path)
    assert "'n' above 1 is answered by a local batch" in (tmp_path / "fleet.jsonl").read_text() + refused.stderr.decode()


def test_run_with_n(synth_model, tmp_path):
    import json

    from helpers.processes import run_tallow

    ask = ["run", str(synth_model), PROMPT, "--seed", "11", "--temperature", "0.8", "--max-tokens", "8",
           "--threads", "2"]
    runs = [run_tallow([*ask, "--n", "3", "--json"], home=tmp_path) for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr.decode()
    first, again = (json.loads(r.stdout) for r in runs)
    texts = [c["text"] for c in first["choices"]]
    assert [c["index"] for c in first["choices"]] == [0, 1, 2] and len(set(texts)) == 3
    assert [c["text"] for c in again["choices"]] == texts  # a seed reproduces all three
    one = json.loads(run_tallow([*ask, "--json"], home=tmp_path).stdout)
    assert first["usage"]["prompt_tokens"] == one["usage"]["prompt_tokens"]  # the prompt counted once
    assert first["usage"]["completion_tokens"] == 24 and "text" not in first

    shown = run_tallow([*ask, "--n", "3"], home=tmp_path)
    assert shown.returncode == 0, shown.stderr.decode()
    parts = shown.stdout.decode().split("--- answer ")
    assert [p.split(" ---\n", 1)[0] for p in parts[1:]] == ["1 of 3", "2 of 3", "3 of 3"]
    assert [p.split(" ---\n", 1)[1].strip("\n") for p in parts[1:]] == [t.strip("\n") for t in texts]

    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps([{"name": "f", "parameters": {"type": "object"}}]))
    for extra, named in ((["--endpoint", "http://127.0.0.1:9"], "--n"), (["--tools", str(tools)], "--n"),
                         (["--flash-attn", "off"], "--flash-attn off")):
        refused = run_tallow([*ask[:-2], "--n", "2", *extra], home=tmp_path)  # without --threads (local only)
        assert refused.returncode != 0 and named in refused.stderr.decode(), refused.stderr.decode()
