"""tallow batch --ray on a real Ray cluster of this machine (a head and two worker nodes of
one CPU each, all on 127.0.0.1): the answers equal a local batch's, a worker node lost
mid-batch or the driver killed costs nothing written, shared prefixes meet a warm cache,
weights are shipped through the object store when asked, and without Ray the refusal is one
line."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import pytest
from helpers.processes import run_tallow, tallow_env

pytest.importorskip("ray")  # a test extra; the refusal without it is tested below all the same

from helpers.ray_cluster import LoopbackCluster  # noqa: E402 - sets Ray's environment first

pytestmark = pytest.mark.slow  # a Ray cluster of three nodes


@pytest.fixture(scope="module")
def cluster():
    c = LoopbackCluster(workers=2)
    try:
        yield c
    finally:
        c.shutdown()


def _write(path: Path, n: int, max_tokens: int, system: str | None = None, group: int = 0) -> list[str]:
    ids = []
    with open(path, "a") as f:
        for i in range(n):
            rid = f"g{group}-{i}"
            if system is not None:
                body = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": f"Question {i}?"}]}
            elif i % 3 == 0:
                body = {"prompt": f"Item {i} of the list is", "temperature": 0}
            else:
                body = {"messages": [{"role": "user", "content": f"Name a colour and the number {i}."}]}
            f.write(json.dumps({"id": rid, **body, "max_tokens": max_tokens, "temperature": 0}) + "\n")
            ids.append(rid)
    return ids


def _records(path: Path) -> list[dict]:
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b"", "the output ends with a partial line"
    return [json.loads(line) for line in lines[:-1]]


def _lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def _start(args: list[str], home: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tallow.cli", *args], env=tallow_env(home),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _wait_for(path: Path, n: int, proc: subprocess.Popen, limit: float = 240) -> None:
    deadline = time.monotonic() + limit
    while _lines(path) < n:
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else proc.returncode
        assert time.monotonic() < deadline, f"only {_lines(path)} records"
        time.sleep(0.05)


def _ray(cluster, *more: str) -> list[str]:
    return ["--ray", cluster.address, "--ray-actors", "2", "--offline", *more]


@pytest.mark.default_model
def test_sixty_prompts_over_two_actors_equal_a_local_batch(cluster, default_home, tmp_path):
    source = tmp_path / "in.jsonl"
    ids = _write(source, 60, max_tokens=12)
    local = run_tallow(["batch", str(source), "-o", str(tmp_path / "local.jsonl"), "--deterministic", "--offline"],
                       home=default_home)
    assert local.returncode == 0, local.stderr.decode()
    done = run_tallow(["batch", str(source), "-o", str(tmp_path / "ray.jsonl"), "--deterministic", *_ray(cluster)],
                      home=default_home)
    err = done.stderr.decode()
    assert done.returncode == 0, err
    records = _records(tmp_path / "ray.jsonl")
    assert Counter(r["id"] for r in records) == Counter(ids)
    expected = {r["id"]: r["text"] for r in _records(tmp_path / "local.jsonl")}
    assert {r["id"]: r["text"] for r in records} == expected
    assert all(r["usage"]["completion_tokens"] > 0 for r in records)
    # two actors, on the two worker nodes, both answering
    shares = re.findall(r"actor \d on 127\.0\.0\.1 \((\w+)\): (\d+) answered", err)
    assert len({node for node, _ in shares}) == 2 and all(int(n) > 0 for _, n in shares), err
    assert "0 replaced" in err


@pytest.mark.default_model
def test_a_worker_node_lost_mid_batch_costs_nothing(cluster, default_home, tmp_path):
    cluster.ensure_workers(2)
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = _write(source, 60, max_tokens=24)
    proc = _start(["batch", str(source), "-o", str(out), "--parallel", "4", *_ray(cluster)], default_home)
    try:
        _wait_for(out, 6, proc)
        cluster.remove_worker(cluster.workers[0])
        _, err = proc.communicate(timeout=400)
    finally:
        proc.kill()
        cluster.ensure_workers(2)
    err = err.decode()
    assert proc.returncode == 0, err
    records = _records(out)
    assert Counter(r["id"] for r in records) == Counter(ids), "every id exactly once"
    # replaced once at least (its replacement may itself land on the dying node, before Ray
    # has marked it dead, and be replaced again)
    assert int(re.search(r"(\d+) replaced", err).group(1)) >= 1, err
    # the lost actor's requests in flight were answered again, by the other
    assert any(r.get("attempts", 1) > 1 for r in records), err


@pytest.mark.default_model
def test_the_driver_killed_and_rerun_skips_what_it_wrote(cluster, default_home, tmp_path):
    cluster.ensure_workers(2)
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = _write(source, 40, max_tokens=24)
    args = ["batch", str(source), "-o", str(out), "--parallel", "4", *_ray(cluster)]
    proc = _start(args, default_home)
    try:
        _wait_for(out, 5, proc)
    finally:
        proc.kill()  # SIGKILL: no chance to clean up; Ray ends the job's actors
        proc.wait()
    written = [json.loads(line) for line in out.read_bytes().split(b"\n")[:-1]]
    assert written and len(written) < len(ids)
    again = run_tallow(args, home=default_home, timeout=400)
    err = again.stderr.decode()
    assert again.returncode == 0, err
    assert f"{len(written)} already in" in err, err
    records = _records(out)
    assert Counter(r["id"] for r in records) == Counter(ids)
    assert records[:len(written)] == written, "what the killed run wrote is kept as it was"


@pytest.mark.default_model
def test_rows_sharing_a_long_system_prompt_are_served_from_cache(cluster, default_home, tmp_path):
    cluster.ensure_workers(2)
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    for g in range(2):
        system = f"You are helper {g}. " + f"Rule {g}: answer briefly and politely, in plain words. " * 30
        _write(source, 16, max_tokens=2, system=system, group=g)
    done = run_tallow(["batch", str(source), "-o", str(out), "--parallel", "2", *_ray(cluster)], home=default_home)
    err = done.stderr.decode()
    assert done.returncode == 0, err
    records = _records(out)
    prompt = sum(r["usage"]["prompt_tokens"] for r in records)
    cached = sum(r["usage"]["cached_tokens"] for r in records)
    assert cached > prompt * 0.6, (cached, prompt, err)


def test_weights_shipped_through_the_object_store(cluster, synth_model, tmp_path):
    from tallow.common.files import sha256_file

    cluster.ensure_workers(2)
    home = tmp_path / "home"
    source = tmp_path / "in.jsonl"
    ids = _write(source, 6, max_tokens=6)
    local = run_tallow(["batch", str(source), "-o", str(tmp_path / "local.jsonl"), "-m", str(synth_model),
                        "--deterministic", "--offline"], home=home)
    assert local.returncode == 0, local.stderr.decode()
    done = run_tallow(["batch", str(source), "-o", str(tmp_path / "ray.jsonl"), "-m", str(synth_model),
                       "--deterministic", "--ray-weights", "ship", *_ray(cluster)], home=home)
    err = done.stderr.decode()
    assert done.returncode == 0, err
    assert f"shipped {synth_model.name}" in err, err
    copy = Path(tempfile.gettempdir()) / "tallow-ray-weights" / f"sha256-{sha256_file(synth_model)}"
    assert copy.is_file() and copy.read_bytes() == synth_model.read_bytes()
    records = _records(tmp_path / "ray.jsonl")
    assert sorted(r["id"] for r in records) == sorted(ids)
    assert {r["id"]: r["text"] for r in records} == {r["id"]: r["text"] for r in _records(tmp_path / "local.jsonl")}


def test_without_ray_installed_the_refusal_is_one_line(tmp_path):
    blocker = tmp_path / "blocker" / "ray"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError(\"No module named 'ray'\")\n")
    source = tmp_path / "in.jsonl"
    _write(source, 2, max_tokens=4)
    done = run_tallow(["batch", str(source), "-o", str(tmp_path / "out.jsonl"), "--ray", "local"],
                      home=tmp_path / "home", env={"PYTHONPATH": str(blocker.parent)})
    err = done.stderr.decode().strip()
    assert done.returncode != 0
    assert err.count("\n") == 0 and 'pip install "tallow[ray]"' in err, err
    assert not (tmp_path / "out.jsonl").exists()


def test_a_node_lacking_a_file_says_so_and_a_shipped_copy_is_checked(tmp_path):
    from tallow.common.errors import TallowError
    from tallow.runtime.node_weights import Missing, WeightFile, may_ship, node_path, plan

    data = b"GGUF" + bytes(range(256)) * 64
    source = tmp_path / "model.gguf"
    source.write_bytes(data)
    w = plan([source], "auto", put=lambda b: pytest.fail("auto ships nothing up front"))[str(source)]
    assert node_path(w, tmp_path / "cache", "n1", fetch=None) == (source, "path")
    elsewhere = WeightFile(str(tmp_path / "not-on-this-node.gguf"), w.size, w.sha256)
    with pytest.raises(Missing, match="node n1 has no copy of not-on-this-node.gguf") as caught:
        node_path(elsewhere, tmp_path / "cache", "n1", fetch=None)
    assert caught.value.path == elsewhere.path
    assert may_ship(elsewhere, "auto", ship_max=w.size) and not may_ship(elsewhere, "auto", ship_max=w.size - 1)
    assert not may_ship(elsewhere, "path", ship_max=1 << 30)
    sent = WeightFile(elsewhere.path, w.size, w.sha256, blob="ref", by_path=False)
    got, how = node_path(sent, tmp_path / "cache", "n1", fetch=lambda ref: data)
    assert how == "shipped" and got == tmp_path / "cache" / f"sha256-{w.sha256}" and got.read_bytes() == data
    damaged = WeightFile(elsewhere.path, w.size, "0" * 64, blob="ref", by_path=False)
    with pytest.raises(TallowError, match="does not match its digest"):
        node_path(damaged, tmp_path / "cache2", "n1", fetch=lambda ref: data)
    assert not any((tmp_path / "cache2").iterdir()), "nothing half-written is left"
    shipped_all = plan([source], "ship", put=lambda b: ("ref", len(b)))[str(source)]
    assert shipped_all.blob == ("ref", len(data)) and not shipped_all.by_path
