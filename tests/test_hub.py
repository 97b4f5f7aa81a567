"""Pulling from the hub, emulated by a local server so the real huggingface_hub code runs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from helpers.processes import run_tallow

from tallow.models.errors import FetchError, IntegrityError, ModelNotFound, TallowError
from tallow.models.hub import Hub, HubFile, choose, quant_of
from tallow.models.pull import PullOptions, pull
from tallow.models.refs import HubRef, parse_ref
from tallow.models.resolve import locate
from tallow.models.store import Store, sha256_file

pytestmark = pytest.mark.slow  # downloads from a stand-in hub

REPO = "tallow-test/Synthetic-GGUF"
FILE = "synthetic-Q8_0.gguf"


@pytest.fixture
def hub_repo(fake_hub, synth_model):
    fake_hub.add(REPO, FILE, synth_model)
    return fake_hub


def options(hub, **kw) -> PullOptions:
    return PullOptions(hub=Hub(endpoint=hub.url, token=kw.pop("token", None)), **kw)


def hub_env(hub, home, **extra) -> dict:
    return {"HF_ENDPOINT": hub.url, "TALLOW_HOME": str(home), **extra}


def leftovers(store: Store) -> list[str]:
    names = [p.name for p in store.tmp.iterdir()] if store.tmp.exists() else []
    return [n for n in names if not n.endswith(".lock")]


def test_pull_then_run(hub_repo, synth_model, tmp_path):
    home = tmp_path / "home"
    r = run_tallow(["pull", f"hf.co/{REPO}:q8_0"], home=home, env=hub_env(hub_repo, home))
    assert r.returncode == 0, r.stderr.decode()
    assert f"pulled {REPO}:Q8_0" in r.stderr.decode()
    store = Store(home / "models")
    manifest = store.get(f"{REPO}:Q8_0")
    assert manifest.files[0].digest == f"sha256-{sha256_file(synth_model)}"
    assert manifest.source["repo"] == REPO and manifest.gguf["architecture"] == "llama"
    r = run_tallow(["run", f"{REPO}:Q8_0", "hello", "-n", "4", "--json"], home=home, env=hub_env(hub_repo, home))
    assert r.returncode == 0, r.stderr.decode()
    assert json.loads(r.stdout)["usage"]["completion_tokens"] >= 1
    listed = json.loads(run_tallow(["list", "--json"], home=home).stdout)
    assert [m["name"] for m in listed] == [f"{REPO}:Q8_0"]


def test_run_pulls_a_reference_that_is_not_stored(hub_repo, tmp_path):
    home = tmp_path / "home"
    r = run_tallow(["run", f"{REPO}:Q8_0", "hello", "-n", "3"], home=home, env=hub_env(hub_repo, home))
    assert r.returncode == 0, r.stderr.decode()
    assert hub_repo.downloads(FILE) == 1


def test_resume_after_the_server_cuts_the_connection(hub_repo, synth_model, tmp_path):
    store = Store(tmp_path / "models")
    hub_repo.mode = "cut"
    with pytest.raises(FetchError, match="download of .* failed|stopped at"):
        pull(parse_ref(f"{REPO}:Q8_0"), store, options(hub_repo))
    assert store.get(f"{REPO}:Q8_0") is None
    partial = [p for p in store.tmp.iterdir() if p.name.endswith(".partial")]
    have = partial[0].stat().st_size if len(partial) == 1 else 0
    assert 0 < have < synth_model.stat().st_size
    manifest = pull(parse_ref(f"{REPO}:Q8_0"), store, options(hub_repo))
    assert hub_repo.ranges == [have]  # asked only for the rest
    assert sha256_file(store.model_file(manifest)) == sha256_file(synth_model)
    assert leftovers(store) == []


def test_bytes_that_differ_from_the_advertised_sha256_are_deleted(hub_repo, tmp_path):
    store = Store(tmp_path / "models")
    hub_repo.mode = "corrupt"
    with pytest.raises(IntegrityError, match="do not match the published checksum.*deleted"):
        pull(parse_ref(f"{REPO}:Q8_0"), store, options(hub_repo))
    assert store.get(f"{REPO}:Q8_0") is None
    assert leftovers(store) == [] and not list(store.blobs.glob("*"))


def test_missing_repository_and_file(hub_repo, tmp_path):
    store = Store(tmp_path / "models")
    with pytest.raises(ModelNotFound, match="was not found on the hub"):
        pull(parse_ref("nobody/Nothing-GGUF"), store, options(hub_repo))
    with pytest.raises(ModelNotFound, match=r"has no Q2_K file.*") as err:
        pull(parse_ref(f"{REPO}:Q2_K"), store, options(hub_repo))
    assert "Q8_0" in err.value.hint


def test_private_repository_needs_hf_token(hub_repo, tmp_path):
    home = tmp_path / "home"
    hub_repo.mode = "private"
    r = run_tallow(["pull", f"{REPO}:Q8_0"], home=home, env=hub_env(hub_repo, home))
    assert r.returncode == 1 and b"HF_TOKEN" in r.stderr and b"Traceback" not in r.stderr
    r = run_tallow(["pull", f"{REPO}:Q8_0"], home=home, env=hub_env(hub_repo, home, HF_TOKEN=hub_repo.token))
    assert r.returncode == 0, r.stderr.decode()


def test_gated_repository_says_so(hub_repo, tmp_path):
    hub_repo.mode = "gated"
    with pytest.raises(FetchError, match="gated") as err:
        pull(parse_ref(f"{REPO}:Q8_0"), Store(tmp_path / "models"), options(hub_repo))
    assert "HF_TOKEN" in err.value.hint


def test_two_processes_pulling_at_once_end_with_one_blob(hub_repo, synth_model, tmp_path):
    home = tmp_path / "home"
    hub_repo.mode = "slow"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TALLOW_")}
    env.update(hub_env(hub_repo, home))
    cmd = [sys.executable, "-m", "tallow.cli", "pull", f"{REPO}:Q8_0"]
    procs = [subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for _ in range(2)]
    results = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], results
    store = Store(home / "models")
    assert [p.name for p in store.blobs.iterdir()] == [f"sha256-{sha256_file(synth_model)}"]
    assert hub_repo.downloads(FILE) == 1  # the second process waited, then found the blob
    assert leftovers(store) == []


def test_disk_full_is_refused_before_downloading(hub_repo, tmp_path):
    store = Store(tmp_path / "models")
    with pytest.raises(FetchError, match=r"not enough disk space.*needs .* MB, 0 MB free"):
        pull(parse_ref(f"{REPO}:Q8_0"), store, options(hub_repo, free_space=lambda path: 1000))
    assert hub_repo.downloads(FILE) == 0


def test_model_larger_than_memory_asks_for_force(hub_repo, tmp_path):
    store = Store(tmp_path / "models")
    small = options(hub_repo, free_memory=lambda: 1000)
    with pytest.raises(TallowError, match="of memory with a 1024-token context .* is available") as err:
        pull(parse_ref(f"{REPO}:Q8_0"), store, small)
    assert "--force" in err.value.hint and hub_repo.downloads(FILE) == 0
    forced = options(hub_repo, free_memory=lambda: 1000, force=True)
    assert pull(parse_ref(f"{REPO}:Q8_0"), store, forced).name == f"{REPO}:Q8_0"


def test_the_fit_check_plans_from_the_header_read_before_the_download(hub_repo, synth_model, tmp_path):
    """The weights' header comes first, by a range read; the memory planner then counts the
    KV cache and buffers for the default context too, as a load would: a model whose file
    fits in memory but whose load would not is refused before any download."""
    from tallow.models.gguf_file import read_gguf
    from tallow.models.memory import Shape, estimate

    planned = estimate(Shape.from_gguf([read_gguf(synth_model)]), 1024).total  # its trained context, under the cap
    size = synth_model.stat().st_size
    assert planned > size * 1.2  # the test means something: the planner asks more than the file
    store = Store(tmp_path / "models")
    tight = options(hub_repo, free_memory=lambda: (size + planned) // 2)
    with pytest.raises(TallowError, match=r"needs .* of memory with a 1024-token context \(.* of weights, .* of KV "
                                          r"cache, .* of buffers\) but .* is available") as err:
        pull(parse_ref(f"{REPO}:Q8_0"), store, tight)
    assert "--force" in err.value.hint
    assert hub_repo.downloads(FILE) == 0 and hub_repo.bounded and hub_repo.bounded[0][0] == 0
    enough = options(hub_repo, free_memory=lambda: planned + 1)
    assert pull(parse_ref(f"{REPO}:Q8_0"), store, enough).name == f"{REPO}:Q8_0"
    assert hub_repo.downloads(FILE) == 1


def test_catalog_short_name_pulls_its_repository(fake_hub, synth_model, tmp_path):
    fake_hub.add("Qwen/Qwen2.5-0.5B-Instruct-GGUF", "qwen2.5-0.5b-instruct-q4_k_m.gguf", synth_model)
    fake_hub.add("Qwen/Qwen2.5-0.5B-Instruct-GGUF", "qwen2.5-0.5b-instruct-q8_0.gguf", synth_model)
    store = Store(tmp_path / "models")
    manifest = pull(parse_ref("qwen2.5:0.5b"), store, options(fake_hub))
    assert manifest.name == "qwen2.5:0.5b"
    assert manifest.source["files"] == ["qwen2.5-0.5b-instruct-q4_k_m.gguf"]
    assert locate("qwen2.5:0.5b", store).paths == store.paths(manifest)


def test_sharded_model_is_pulled_whole_and_loads(fake_hub, tmp_path):
    import gguf
    import numpy as np

    repo = "tallow-test/Sharded-GGUF"
    from helpers.synth import write_synthetic_gguf

    whole = write_synthetic_gguf(tmp_path / "whole.gguf")
    # split with the gguf package's own reader/writer: two shards, tensors divided between them
    reader = gguf.GGUFReader(str(whole))
    tensors = list(reader.tensors)
    halves = [tensors[: len(tensors) // 2], tensors[len(tensors) // 2:]]
    for i, part in enumerate(halves):
        w = gguf.GGUFWriter(str(tmp_path / f"m-Q8_0-0000{i + 1}-of-00002.gguf"), "llama")
        if i == 0:
            for field in reader.fields.values():
                if field.name.startswith("GGUF.") or field.name == "general.architecture":
                    continue
                w.add_key_value(field.name, field.contents(), field.types[0], field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None)
        w.add_uint16("split.no", i)
        w.add_uint16("split.count", 2)
        w.add_int32("split.tensors.count", len(tensors))
        for t in part:
            w.add_tensor(t.name, np.array(t.data), raw_shape=None)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        fake_hub.add(repo, f"m-Q8_0-0000{i + 1}-of-00002.gguf", tmp_path / f"m-Q8_0-0000{i + 1}-of-00002.gguf")
    store = Store(tmp_path / "models")
    manifest = pull(parse_ref(repo), store, options(fake_hub))
    assert [f.path for f in manifest.files] == ["m-Q8_0-00001-of-00002.gguf", "m-Q8_0-00002-of-00002.gguf"]
    assert manifest.gguf["parameters"] == sum(t.n_elements for t in tensors)
    from tallow.runtime.engine import Engine
    from tallow.runtime.types import LoadSettings, Request, Sampling

    with Engine(store.paths(manifest), LoadSettings(n_ctx=128, n_threads=2)) as engine:
        events = list(engine.stream(Request(engine.tokenize("hello"), 3, (), Sampling(temperature=0), ignore_eos=True)))
        assert events[-1].usage.completion_tokens == 3


def hub_files(*paths: str) -> list[HubFile]:
    return [HubFile(p, 1, "0" * 64, None) for p in paths]


def test_quantization_choice():
    files = hub_files("m-Q4_K_M.gguf", "m-Q8_0.gguf", "m-q2_k.gguf", "mmproj-m-F16.gguf")
    assert [f.path for f in choose("r", files, "Q2_K", None)] == ["m-q2_k.gguf"]
    with pytest.raises(ModelNotFound) as err:
        choose("r", hub_files("m-Q8_0.gguf", "m-Q6_K.gguf"), None, None)
    assert "Q6_K" in err.value.hint and "Q8_0" in err.value.hint
    assert [f.path for f in choose("r", hub_files("only-Q6_K.gguf"), None, None)] == ["only-Q6_K.gguf"]
    shards = hub_files("big-Q4_K_M-00002-of-00002.gguf", "big-Q4_K_M-00001-of-00002.gguf", "big-Q8_0-00001-of-00002.gguf")
    assert [f.path for f in choose("r", shards, "Q4_K_M", None)] == ["big-Q4_K_M-00001-of-00002.gguf", "big-Q4_K_M-00002-of-00002.gguf"]
    with pytest.raises(ModelNotFound):  # an incomplete shard set is not offered
        choose("r", shards, "Q8_0", None)
    assert quant_of("Q5_K_M/model-00001-of-00003.gguf") == "Q5_K_M"
    assert quant_of("Llama-3.2-1B-Instruct-IQ4_XS.gguf") == "IQ4_XS"
    assert quant_of("model-UD-Q4_K_XL.gguf") == "UD-Q4_K_XL"


def test_reference_normalization():
    assert parse_ref("hf.co/Org/Repo-GGUF:q4_k_m") == HubRef("Org/Repo-GGUF", "Q4_K_M", None, "Org/Repo-GGUF:Q4_K_M")
    assert parse_ref("Org/Repo-GGUF").name == "Org/Repo-GGUF:latest"
    assert parse_ref("Org/Repo-GGUF/file-Q8_0.gguf") == HubRef("Org/Repo-GGUF", None, "file-Q8_0.gguf",
                                                               "Org/Repo-GGUF/file-Q8_0.gguf:latest")


def test_an_unreachable_hub_is_one_error_at_once_without_retries(tmp_path):
    """No route to the hub: one connection attempt, two lines (error and hint), no retry noise."""
    import socket
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.settimeout(0.2)
    attempts = []
    stop = threading.Event()

    def reset_every_connection() -> None:  # a dead link: accept, then drop the connection
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            attempts.append(1)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
            conn.close()

    thread = threading.Thread(target=reset_every_connection, daemon=True)
    thread.start()
    home = tmp_path / "home"
    try:
        r = run_tallow(["pull", "Qwen/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M"], home=home,
                       env={"HF_ENDPOINT": f"http://127.0.0.1:{listener.getsockname()[1]}"})
    finally:
        stop.set()
        thread.join(5)
        listener.close()
    lines = r.stderr.decode().splitlines()
    assert r.returncode == 1
    assert len(lines) == 2 and lines[0].startswith("error: cannot reach the hub at http://127.0.0.1:"), lines
    assert lines[1].startswith("hint: set HF_ENDPOINT to a mirror") and "tallow import" in lines[1]
    assert len(attempts) == 1  # not five retries with backoff


def test_the_pull_progress_bar_stays_on_one_line_in_80_columns(fake_hub, synth_model, tmp_path):
    from helpers.processes import tallow_env
    from helpers.terminal import Terminal, plain

    repo = "tallow-test/A-Rather-Long-Repository-Name-Instruct-GGUF"
    fake_hub.add(repo, "a-rather-long-repository-name-instruct-q4_k_m.gguf", synth_model)
    fake_hub.mode = "slow"
    env = tallow_env(tmp_path / "home", {"HF_ENDPOINT": fake_hub.url, "TERM": "xterm"})
    env.pop("NO_COLOR")  # a terminal that allows a live bar
    term = Terminal(["pull", f"{repo}:Q4_K_M"], env, columns=80)
    assert term.wait(120) == 0, term.buf.decode(errors="replace")
    # Every frame Rich drew: cursor movements and line erases split them into lines.
    frames = [f for f in re.split(r"\x1b\[\d*[AKG]|\r|\n", term.buf.decode(errors="replace"))]
    shown = [plain(f) for f in frames if plain(f).strip()]
    bars = [f for f in shown if "kB" in f and "━" in f]
    assert bars, shown  # the bar was drawn
    assert all(len(f) <= 80 for f in shown), [f for f in shown if len(f) > 80]
    assert all(re.search(r" \d+\.\d/443\.5 kB ", f) for f in bars), bars  # the figures are never cut
