"""Finding a model that fits: the hub's search, each repository's quantizations judged from
one header read by range, pull choosing the largest that fits, and the pickers on a terminal.
The hub is the local emulator (tests/helpers/hub_server.py), so huggingface_hub's own client runs."""

from __future__ import annotations

import json
import re

import pytest
from helpers.processes import run_tallow, tallow_env
from helpers.terminal import Terminal

from tallow.models.errors import TallowError
from tallow.models.finding.fit import Budget, largest_fitting, variants
from tallow.models.finding.search import Filters, search
from tallow.models.hub import Hub
from tallow.models.pull import PullOptions, pull
from tallow.models.refs import parse_ref
from tallow.models.store import Store
from tallow.runtime.host.devices import knows_architecture

pytestmark = pytest.mark.slow  # a stand-in hub, and downloads from it

REPO = "tallow-test/Synth-GGUF"
OTHER = "someone/Other-Synth-GGUF"
TYPES = {"F32": 0, "F16": 1, "Q8_0": 7}  # llama.cpp's file types


@pytest.fixture(scope="module")
def quantized(synth_model, tmp_path_factory):
    """The synthetic model in three real, loadable precisions: F32 > F16 > Q8_0 in size."""
    from tallow.runtime import backend

    folder = tmp_path_factory.mktemp("quants")
    out = {"F32": synth_model}
    for name in ("F16", "Q8_0"):
        out[name] = folder / f"synth-{name}.gguf"
        assert backend.quantize(synth_model, out[name], TYPES[name]) == 0
    return out


@pytest.fixture
def hub(fake_hub, quantized):
    for name, path in quantized.items():
        fake_hub.add(REPO, f"synth-{name}.gguf", path)
    fake_hub.add(OTHER, "other-Q8_0.gguf", quantized["Q8_0"])
    fake_hub.describe(REPO, downloads=5000, likes=3, license="apache-2.0", lastModified="2026-11-02T10:00:00.000Z")
    fake_hub.describe(OTHER, downloads=20, likes=90, license="mit", lastModified="2026-12-01T10:00:00.000Z")
    return fake_hub


def head_reads(hub) -> list[str]:
    return [p for method, p, h in hub.requests if method == "GET" and "/resolve/" in p
            and re.fullmatch(r"bytes=\d+-\d+", h.get("Range", ""))]


def test_one_header_read_prices_every_quantization(hub, quantized):
    files = Hub(endpoint=hub.url).list_files(REPO)
    found, headers = variants(Hub(endpoint=hub.url), REPO, files, Budget(10**12, None, 4096))
    assert [v.quant for v in found] == ["Q8_0", "F16", "F32"]  # smallest first
    assert headers is not None and headers[0].architecture == "llama"
    assert head_reads(hub) == [f"/{REPO}/resolve/main/synth-Q8_0.gguf"]  # the smallest one's header, once
    needs = [v.need for v in found]
    assert needs == sorted(needs) and len(set(needs)) == 3
    overhead = [v.need - v.size for v in found]  # KV cache and buffers: alike in every quantization
    assert max(overhead) - min(overhead) < 0.05 * min(overhead)
    assert all(v.n_ctx == 1024 for v in found)  # the trained context, under the 4096 cap
    # a budget between F16's need and F32's: F16 is the largest that fits
    room = Budget((found[1].need + found[2].need) // 2, None, 4096)
    judged, _ = variants(Hub(endpoint=hub.url), REPO, files, room)
    assert [v.where for v in judged] == ["ram", "ram", "no"]
    assert largest_fitting(judged).quant == "F16"
    # a GPU's memory counts, less its margin
    gpu = Budget(found[0].need // 2, found[0].need + 600 * 2**20, 4096)
    assert [v.where for v in variants(Hub(endpoint=hub.url), REPO, files, gpu)[0]][0] == "gpu"


def test_pull_without_a_quantization_takes_the_largest_that_fits(hub, tmp_path):
    found, _ = variants(Hub(endpoint=hub.url), REPO, Hub(endpoint=hub.url).list_files(REPO), Budget(10**12, None, 4096))
    notes: list[str] = []
    opts = PullOptions(hub=Hub(endpoint=hub.url), free_memory=lambda: (found[1].need + found[2].need) // 2,
                       on_note=notes.append, ctx_cap=4096)
    manifest = pull(parse_ref(REPO), Store(tmp_path / "models"), opts)
    assert [f.path for f in manifest.files] == ["synth-F16.gguf"]
    assert notes and notes[0].startswith("chose F16: the largest of 3 quantizations that fits") and "F32 would not" in notes[0]
    assert hub.downloads("synth-F32.gguf") == 0


def test_when_none_fits_the_pull_says_so_before_downloading(hub, tmp_path):
    opts = PullOptions(hub=Hub(endpoint=hub.url), free_memory=lambda: 1000, ctx_cap=4096)
    with pytest.raises(TallowError) as err:
        pull(parse_ref(REPO), Store(tmp_path / "models"), opts)
    assert re.search(r"none of .*'s 3 quantizations fits in 1.0 KB of free memory: the smallest, Q8_0, needs", err.value.message)
    assert "--force" in err.value.hint
    assert not [p for m, p, h in hub.requests if "/resolve/" in p and not re.fullmatch(r"bytes=\d+-\d+", h.get("Range", ""))]
    notes: list[str] = []
    forced = PullOptions(hub=Hub(endpoint=hub.url), free_memory=lambda: 1000, force=True, on_note=notes.append)
    assert [f.path for f in pull(parse_ref(REPO), Store(tmp_path / "models"), forced).files] == ["synth-Q8_0.gguf"]
    assert "the smallest" in notes[0]


def test_pull_list_and_the_choice_on_the_command_line(hub, tmp_path):
    home = tmp_path / "home"
    env = {"HF_ENDPOINT": hub.url}
    r = run_tallow(["pull", REPO, "--list", "--json"], home=home, env=env)
    assert r.returncode == 0, r.stderr.decode()
    rows = json.loads(r.stdout)
    assert [(x["quant"], x["fits"], x["chosen"]) for x in rows] == [("Q8_0", True, False), ("F16", True, False),
                                                                   ("F32", True, True)]
    assert all(x["size"] < x["need"] for x in rows)
    text = run_tallow(["pull", REPO, "--list"], home=home, env=env)
    assert re.search(r"F32\s+synth-F32\.gguf\s+.*fits\s+<- pull takes this", text.stdout.decode())
    assert "judged for" in text.stderr.decode() and "1024-token context" in text.stderr.decode()
    r = run_tallow(["pull", REPO], home=home, env=env)
    assert r.returncode == 0, r.stderr.decode()
    assert "chose F32: the largest of 3 quantizations that fits" in r.stderr.decode()
    listed = json.loads(run_tallow(["list", "--json"], home=home).stdout)
    assert [(m["name"], m["quantization"]) for m in listed] == [(f"{REPO}:latest", "F32")]
    bad = run_tallow(["pull", f"{REPO}:Q8_0", "--list"], home=home, env=env)
    assert bad.returncode == 2 and "give ORG/REPO alone" in bad.stderr.decode()
    off = run_tallow(["pull", REPO, "--list"], home=home, env={**env, "TALLOW_OFFLINE": "1"})
    assert off.returncode == 1 and "offline" in off.stderr.decode() and len(off.stderr.decode().strip().splitlines()) <= 2


def test_search_shows_facts_fit_and_support(hub, tmp_path):
    home = tmp_path / "home"
    r = run_tallow(["find", "synth", "--json"], home=home, env={"HF_ENDPOINT": hub.url})
    assert r.returncode == 0, r.stderr.decode()
    got = json.loads(r.stdout)
    assert [x["repo"] for x in got] == [REPO, OTHER]  # by downloads
    first = got[0]
    assert (first["architecture"], first["license"], first["downloads"], first["updated"]) == \
        ("llama", "apache-2.0", 5000, "2026-11-02")
    assert first["parameters"] > 0 and first["supported"] is True and first["best"] == "F32"
    assert [q["quant"] for q in first["quantizations"]] == ["Q8_0", "F16", "F32"]
    by_likes = json.loads(run_tallow(["find", "synth", "--sort", "likes", "--json"], home=home,
                                     env={"HF_ENDPOINT": hub.url}).stdout)
    assert [x["repo"] for x in by_likes] == [OTHER, REPO]
    assert json.loads(run_tallow(["find", "synth", "--arch", "qwen3", "--json"], home=home,
                                 env={"HF_ENDPOINT": hub.url}).stdout) == []
    small = run_tallow(["find", "synth", "--max-params", "1K", "--json"], home=home, env={"HF_ENDPOINT": hub.url})
    assert json.loads(small.stdout) == []
    table = run_tallow(["find", "synth", "-n", "1"], home=home, env={"HF_ENDPOINT": hub.url}).stdout.decode()
    assert REPO in table and OTHER not in table and "F32" in table and "apache-2.0" in table
    for args, words in ((["--sort", "stars"], "not an order"), (["--max-params", "lots"], "not a parameter count")):
        bad = run_tallow(["find", "synth", *args], home=home, env={"HF_ENDPOINT": hub.url})
        assert bad.returncode == 2 and words in bad.stderr.decode()
    asked = len(hub.requests)
    off = run_tallow(["find", "synth", "--offline"], home=home, env={"HF_ENDPOINT": hub.url})
    assert off.returncode == 1 and "offline mode is on: the hub cannot be searched" in off.stderr.decode()
    assert len(hub.requests) == asked  # not one request


def test_an_architecture_llama_cpp_lacks_is_flagged(hub):
    hub.describe(OTHER, downloads=1, gguf={"architecture": "made-up-arch", "total": 1000, "context_length": 512})
    results = search(Hub(endpoint=hub.url), "synth", budget=Budget(10**12, None, 4096), supports=knows_architecture)
    assert {r.listing.repo: r.supported for r in results} == {REPO: True, OTHER: False}
    assert knows_architecture("qwen3moe") and knows_architecture("bert") and not knows_architecture("lla")
    only = search(Hub(endpoint=hub.url), "", filters=Filters(architecture="made-up-arch"), budget=Budget(10**12, None, 4096))
    assert [r.listing.repo for r in only] == [OTHER]


def test_a_gated_repository_is_listed_with_its_reason(hub):
    hub.mode = "gated"  # the search answers; the file listing does not
    results = search(Hub(endpoint=hub.url), "synth", budget=Budget(10**12, None, 4096))
    assert all(r.problem and "gated" in r.problem and r.best is None for r in results)


def terminal(args, hub, home) -> Terminal:
    env = tallow_env(home, {"HF_ENDPOINT": hub.url, "TERM": "xterm"})
    return Terminal(args, env)


def test_the_pickers_pull_what_the_arrow_keys_choose(hub, tmp_path):
    home = tmp_path / "home"
    t = terminal(["pull", REPO], hub, home)
    t.read_until(r"which quantization\?")
    t.read_until(r"> F32")  # the largest that fits, marked
    t.send("\x1b[A")  # up: F16
    t.read_until(r"> F16")
    t.send("\r")
    t.read_until(r"pulled .*:latest")
    assert t.wait() == 0
    listed = json.loads(run_tallow(["list", "--json"], home=home).stdout)
    assert [m["quantization"] for m in listed] == ["F16"]
    t = terminal(["find", "synth"], hub, home)
    t.read_until("pull which")
    t.send("j")  # down: the second result (typed as soon as the title shows: a key typed ahead is kept)
    t.read_until(f"> {OTHER}:Q8_0")
    t.send("\r")
    t.read_until(r"pulled someone/Other-Synth-GGUF:Q8_0")
    assert t.wait() == 0
    t = terminal(["pull", REPO + "-nothing-stored"], hub, home)
    t.read_until(r"not found|no GGUF|error")
    t.wait()
    t = terminal(["find", "synth"], hub, home)
    t.read_until("pull which")
    t.send("\x1b")  # Esc: nothing pulled
    assert t.wait() == 0
    assert len(json.loads(run_tallow(["list", "--json"], home=home).stdout)) == 2


def test_a_file_whose_name_says_no_quantization_is_shown_by_its_name(hub, quantized, tmp_path):
    hub.add("someone/Plain", "weights.gguf", quantized["Q8_0"])
    r = run_tallow(["find", "plain"], home=tmp_path / "home", env={"HF_ENDPOINT": hub.url})
    assert r.returncode == 0, r.stderr.decode()
    assert re.search(r"someone/Plain .* weights\.gguf \(", r.stdout.decode())
