"""tallow serve with several models: runner processes, LRU unloading, keep_alive, crash
containment, and `tallow ps` / `tallow stop` against a live server."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers.processes import run_tallow
from helpers.server import Server
from helpers.synth import write_synthetic_gguf

pytestmark = pytest.mark.slow  # several runner processes, one crashed

openai = pytest.importorskip("openai")
ollama = pytest.importorskip("ollama")

USER = [{"role": "user", "content": "Tell me a story"}]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("models")
    return {name: write_synthetic_gguf(folder / f"{name}.gguf", seed=seed) for name, seed in
            (("a", 11), ("b", 22), ("c", 33))}


@pytest.fixture(scope="module")
def home(tmp_path_factory, files) -> Path:
    home = tmp_path_factory.mktemp("multi-home")
    for name, path in files.items():
        done = run_tallow(["import", str(path), "--name", f"{name}:tiny"], home=home)
        assert done.returncode == 0, done.stderr
    return home


def loaded(server) -> dict[str, dict]:
    return {m["name"]: m for m in server.raw("/api/ps")[2]["models"]}


def cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")


def wait_for(check, what: str, limit: float = 60.0):
    deadline = time.monotonic() + limit
    while not (got := check()):
        assert time.monotonic() < deadline, what
        time.sleep(0.05)
    return got


def ask(server, model: str, n: int = 8, **kw) -> str:
    c = server.client()
    r = c.chat.completions.create(model=model, messages=USER, max_tokens=n, temperature=0, **kw)
    return r.choices[0].message.content


def test_two_models_answer_interleaved_requests(files, tmp_path):
    # a file's own settings named by its path, spelt another way than at start
    respelt = f"{files['b'].parent}/../{files['b'].parent.name}/b.gguf"
    s = Server(files["a"], tmp_path, str(files["b"]), "--deterministic", "--parallel", "2",
               "--model-option", f"{respelt} parallel=3")
    try:
        assert "a.gguf (2 parallel" in s.log[-1] and "b.gguf (3 parallel" in s.log[-1]
        alone = {m: ask(s, m, 12) for m in ("a.gguf", "b.gguf")}
        assert alone["a.gguf"] != alone["b.gguf"]  # two different models answered
        assert ask(s, str(files["b"]), 12) == alone["b.gguf"]  # the path answers as the file's name
        with ThreadPoolExecutor(8) as pool:
            jobs = [(m, pool.submit(ask, s, m, 12)) for m in ("a.gguf", "b.gguf") * 4]
            for m, job in jobs:
                assert job.result(timeout=120) == alone[m]
        ps = loaded(s)
        assert set(ps) == {"a.gguf", "b.gguf"} and ps["a.gguf"]["pid"] != ps["b.gguf"]["pid"]
        for m, entry in ps.items():  # each runner says what it is in `ps`
            argv = cmdline(entry["pid"])
            assert argv[1:5] == ["-m", "tallow.cli", "runner", str(files[m[0]])], argv
        assert ps["a.gguf"]["expires_at"] is None  # named at start: loaded until told otherwise
    finally:
        s.close()


def test_least_recently_used_model_unloads_at_max_models(home):
    s = Server(None, home, "--max-models", "2", "--parallel", "1", "--model-option", "c:tiny parallel=3 ctx=3072 gpu_layers=0")
    try:
        assert "on demand" in s.log[-1] and loaded(s) == {}
        for m in ("a:tiny", "b:tiny", "c:tiny"):
            ask(s, m, 2)
        assert set(loaded(s)) == {"b:tiny", "c:tiny"}
        assert (loaded(s)["c:tiny"]["parallel"], loaded(s)["c:tiny"]["context_length"]) == (3, 1024)
        assert loaded(s)["b:tiny"]["parallel"] == 1
        ask(s, "b:tiny", 2)
        ask(s, "a:tiny", 2)  # c was used longest ago
        assert set(loaded(s)) == {"a:tiny", "b:tiny"}
        assert any("unloading c:tiny" in line and "making room for a:tiny" in line for line in s.log)
    finally:
        s.close()


def test_memory_budget_unloads_idle_and_refuses_with_figures(home):
    # The load's estimate as the pool makes it; flash attention pinned, since "auto" follows a
    # calibration that a load may refine, and the compute buffers differ between the two.
    probe = Server(None, home, "--parallel", "1", "--ctx", "8192", "--flash-attn", "off")
    try:
        ask(probe, "a:tiny", 2)
        one = loaded(probe)["a:tiny"]["size"]
    finally:
        probe.close()
    fit = json.loads(run_tallow(["show", "a:tiny", "--fit", "--ctx", "8192", "--json"], home=home).stdout)
    assert fit["flash_attn"] != "off" or fit["total"] == one  # the same planner as tallow show --fit
    s = Server(None, home, "--parallel", "1", "--ctx", "8192", "--memory-budget", str(int(one * 1.5)),
               "--max-tokens", "65000", "--flash-attn", "off")
    try:
        ask(s, "a:tiny", 2)
        ask(s, "b:tiny", 2)
        assert set(loaded(s)) == {"b:tiny"}  # a was idle: it made room
        # b busy with a long answer: a cannot load next to it, and nothing idle can go
        stream = s.client().completions.create(model="b:tiny", prompt="go", max_tokens=65000, stream=True,
                                               extra_body={"ignore_eos": True})
        next(iter(stream))
        status, _, data = s.raw("/v1/chat/completions", json.dumps(
            {"model": "a:tiny", "messages": USER, "max_tokens": 2}).encode())
        assert status == 503 and "busy (b:tiny)" in data["error"]["message"]
        assert "memory budget" in data["error"]["message"] and "MB" in data["error"]["message"]
        stream.close()
        wait_for(lambda: loaded(s)["b:tiny"]["busy"] == 0, "the closed stream kept b busy")
        assert ask(s, "a:tiny", 2) is not None
    finally:
        s.close()
    small = Server(None, home, "--parallel", "1", "--ctx", "8192", "--memory-budget", str(one // 2), "--flash-attn", "off")
    try:
        status, _, data = small.raw("/api/generate", json.dumps({"model": "a:tiny", "prompt": "hi"}).encode())
        assert status == 507 and "does not fit" in data["error"] and "memory budget" in data["error"]
    finally:
        small.close()


def test_keep_alive_expiry_and_forever(home):
    s = Server(None, home, env={"TALLOW_KEEP_ALIVE": "2s"})
    try:
        c = ollama.Client(host=s.url, timeout=120)
        c.generate("b:tiny", "hi", options={"num_predict": 1}, keep_alive=-1)
        c.generate("a:tiny", "hi", options={"num_predict": 1})  # the server default (TALLOW_KEEP_ALIVE): 2 s
        assert set(loaded(s)) == {"a:tiny", "b:tiny"} and loaded(s)["b:tiny"]["expires_at"] is None
        assert loaded(s)["a:tiny"]["expires_at"] is not None
        wait_for(lambda: set(loaded(s)) == {"b:tiny"}, "a outlived its keep_alive", 30)
        c.generate("b:tiny", "hi", options={"num_predict": 1}, keep_alive="2s")
        wait_for(lambda: loaded(s) == {}, "b outlived its keep_alive", 30)
        assert any("keep-alive ran out" in line for line in s.log)
    finally:
        s.close()


def test_a_stopped_runner_cleans_up_after_itself(home):
    # uvicorn raises a SIGTERM again once it has shut down, and the default action ended the
    # runner before its cleanup: its engine's thread claim stayed behind (and its usage writer
    # was never closed); the stdin watch's buffered read then aborted the interpreter's exit
    s = Server(None, home)
    claims = home / "run" / "engines"
    try:
        ask(s, "a:tiny", 2)
        pid = loaded(s)["a:tiny"]["pid"]
        assert (claims / f"{pid}.json").exists()  # a running engine's claim
        assert s.raw("/api/generate", json.dumps({"model": "a:tiny", "keep_alive": 0}).encode())[0] == 200
        wait_for(lambda: not Path(f"/proc/{pid}").exists(), "the unloaded runner lived on", 30)
        assert not (claims / f"{pid}.json").exists()
        ask(s, "b:tiny", 2)
        pid = loaded(s)["b:tiny"]["pid"]
    finally:
        s.close()
    assert s.proc.returncode == 0 and not (claims / f"{pid}.json").exists()
    assert not any("Fatal Python error" in line for line in s.log), "".join(s.log)


def test_a_runner_crash_fails_its_request_only(files, tmp_path):
    marker = tmp_path / "crashed"
    s = Server(files["a"], tmp_path, str(files["b"]), "--parallel", "2", "--max-tokens", "65000", "--ctx", "65536",
               env={"TALLOW_TEST_RUNNER_CRASH": f"a.gguf:5:{marker}"})
    try:
        first = loaded(s)["a.gguf"]["pid"]
        c = s.client()
        other = c.completions.create(model="b.gguf", prompt="go", max_tokens=3000, stream=True,
                                     extra_body={"ignore_eos": True})
        got = iter(other)
        next(got)  # b is mid-answer while a dies
        with pytest.raises(openai.APIError) as died:
            # ignore_eos: the answer reaches the crash at its 5th token (a random model could end
            # sooner, and did under load: the stream finished and nothing was raised)
            for _ in c.chat.completions.create(model="a.gguf", messages=USER, max_tokens=50, stream=True,
                                               extra_body={"ignore_eos": True}):
                pass
        assert "runner for a.gguf stopped mid-answer (killed by SIGSEGV)" in str(died.value)
        rest = list(got)
        assert rest[-1].choices[0].finish_reason == "length"  # b unaffected: it answered to the end
        assert ask(s, "a.gguf", 4) is not None  # a new runner
        assert loaded(s)["a.gguf"]["pid"] != first
        log = "".join(s.log)
        assert "runner for a.gguf" in log and "killed by SIGSEGV" in log and "its last lines" in log
        metrics = s.raw("/metrics")[2]
        assert "tallow_runner_crashes_total 1" in metrics
    finally:
        s.close()


def test_ps_and_stop_commands(files, tmp_path):
    s = Server(files["a"], tmp_path)
    try:
        env = {"TALLOW_HOST": s.url.removeprefix("http://")}
        listed = run_tallow(["ps"], home=tmp_path, env=env)
        assert listed.returncode == 0 and "a.gguf" in listed.stdout.decode() and "100% CPU" in listed.stdout.decode()
        assert "forever" in listed.stdout.decode()
        as_json = json.loads(run_tallow(["ps", "--json"], home=tmp_path, env=env).stdout)
        assert as_json[0]["name"] == "a.gguf" and as_json[0]["context_length"] > 0
        stopped = run_tallow(["stop", "a.gguf"], home=tmp_path, env=env)
        assert stopped.returncode == 0 and "stopped a.gguf" in stopped.stdout.decode()
        assert "no models loaded" in run_tallow(["ps"], home=tmp_path, env=env).stdout.decode()
        again = run_tallow(["stop", "a.gguf"], home=tmp_path, env=env)
        assert again.returncode == 1 and "a.gguf is not loaded" in again.stderr.decode()
        assert ask(s, "a.gguf", 2) is not None  # still served: it loads again on demand
    finally:
        s.close()
    gone = run_tallow(["ps", "--host", s.url.removeprefix("http://")], home=tmp_path)
    assert gone.returncode == 1 and "no tallow server at" in gone.stderr.decode()
    far = run_tallow(["ps", "--host", "192.0.2.1:8080", "--offline"], home=tmp_path)
    assert far.returncode == 1 and "offline" in far.stderr.decode()


def test_an_alias_for_the_name_without_its_tag(files, tmp_path):
    home = tmp_path / "home"
    assert run_tallow(["import", str(files["a"]), "--name", "tinyllama-2:latest"], home=home).returncode == 0
    s = Server("tinyllama-2:latest", home, "--alias", "tinyllama-2")  # once a RecursionError at start
    try:
        for name in ("tinyllama-2", "tinyllama-2:latest"):
            assert ask(s, name, 2) is not None
        assert [m["name"] for m in s.raw("/api/ps")[2]["models"]] == ["tinyllama-2:latest"]
    finally:
        s.close()
