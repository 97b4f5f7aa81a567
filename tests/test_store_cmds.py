"""list, show, rm, cp and import through the CLI, names that must be refused, and offline use."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from helpers.processes import run_tallow

from tallow.common.files import sha256_file
from tallow.models.errors import IntegrityError, InvalidName
from tallow.models.names import parse_name
from tallow.models.store import Manifest, Store


def test_import_copy_and_link_then_list_show_rm(synth_model, tmp_path):
    home = tmp_path / "home"
    assert run_tallow(["import", str(synth_model), "--name", "synth:copy"], home=home).returncode == 0
    r = run_tallow(["import", str(synth_model), "--name", "synth:link", "--link"], home=home)
    assert r.returncode == 0, r.stderr.decode()
    store = Store(home / "models")
    digest = f"sha256-{sha256_file(synth_model)}"
    assert [p.name for p in store.blobs.iterdir()] == [digest]  # the linked one is not copied
    assert store.paths(store.get("synth:link")) == [synth_model.resolve()]

    listed = json.loads(run_tallow(["list", "--json"], home=home).stdout)
    assert [(m["name"], m["quantization"], m["parameters"], m["context_length"], m["linked"]) for m in listed] == [
        ("synth:copy", "F32", 109248, 1024, False), ("synth:link", "F32", 109248, 1024, True)]
    table = run_tallow(["list"], home=home).stdout.decode()
    assert "synth:copy" in table and "109.2K" in table and "\x1b[" not in table

    shown = json.loads(run_tallow(["show", "synth:copy", "--json"], home=home).stdout)
    assert shown["tensor_types"]["F32"]["tensors"] == 21 and shown["architecture"] == "llama"
    assert shown["source"]["kind"] == "import"
    template = run_tallow(["show", "synth:copy", "--template"], home=home).stdout.decode()
    assert template.startswith("{% for message in messages %}")

    dry = run_tallow(["rm", "synth:copy", "--dry-run"], home=home)
    assert b"would remove synth:copy" in dry.stderr and b"would free 443" in dry.stderr
    assert store.get("synth:copy") is not None
    r = run_tallow(["rm", "synth:copy", "synth:link"], home=home)
    assert r.returncode == 0 and b"freed 443" in r.stderr and b"kept linked file" in r.stderr
    assert synth_model.exists() and not list(store.blobs.iterdir())
    assert json.loads(run_tallow(["list", "--json"], home=home).stdout) == []


def test_rm_keeps_blobs_another_model_uses(synth_model, tmp_path):
    home = tmp_path / "home"
    for name in ("a:one", "b:two"):
        assert run_tallow(["import", str(synth_model), "--name", name], home=home).returncode == 0
    r = run_tallow(["rm", "a:one"], home=home)
    assert b"freed 0 B" in r.stderr
    assert Store(home / "models").get("b:two") is not None
    assert run_tallow(["rm", "nothing:here"], home=home).returncode == 1


def test_cp_writes_a_manifest_for_the_same_files(synth_model, tmp_path):
    home = tmp_path / "home"
    assert run_tallow(["import", str(synth_model), "--name", "a:one"], home=home).returncode == 0
    r = run_tallow(["cp", "a:one", "mine"], home=home)
    assert r.returncode == 0 and "copied a:one to mine:latest" in r.stderr.decode()
    store = Store(home / "models")
    a, mine = store.get("a:one"), store.get("mine")
    assert a is not None and mine is not None and mine.files == a.files and mine.source["copied_from"] == "a:one"
    assert len(list((home / "models" / "blobs").iterdir())) == 1  # nothing but the manifest was written
    ran = run_tallow(["run", "mine", "ab", "-n", "2", "--raw", "--json"], home=home)
    assert ran.returncode == 0 and json.loads(ran.stdout)["usage"]["completion_tokens"] == 2
    for args, message in ((["a:one", "mine:latest"], "a model named mine:latest is already stored"),
                          (["a:one", "a:one"], "a model named a:one is already stored"),
                          (["nothing:here", "x"], "nothing:here is not stored"),
                          (["a:one", "bad name!"], "invalid model name")):
        bad = run_tallow(["cp", *args], home=home)
        assert bad.returncode == 1 and message in bad.stderr.decode(), bad.stderr
    assert store.get("mine") == mine  # a refused copy changed nothing
    assert b"freed 0 B" in run_tallow(["rm", "a:one"], home=home).stderr  # the copy still uses the blob
    assert store.get("mine") is not None


def test_changed_linked_file_is_refused(synth_model, tmp_path):
    home = tmp_path / "home"
    copy = tmp_path / "mine.gguf"
    copy.write_bytes(synth_model.read_bytes())
    assert run_tallow(["import", str(copy), "--link"], home=home).returncode == 0
    with open(copy, "ab") as fh:
        fh.write(b"\0" * 32)
    r = run_tallow(["run", "mine", "hi", "-n", "2"], home=home)
    assert r.returncode == 1 and b"changed since it was imported" in r.stderr


def test_linked_file_restored_byte_for_byte_is_accepted(synth_model, tmp_path):
    home = tmp_path / "home"
    copy = tmp_path / "mine.gguf"
    copy.write_bytes(synth_model.read_bytes())
    assert run_tallow(["import", str(copy), "--link"], home=home).returncode == 0
    copy.unlink()
    copy.write_bytes(synth_model.read_bytes())  # restored from a backup: same bytes, new mtime
    os.utime(copy, ns=(1_000_000_000, 1_000_000_000))
    r = run_tallow(["run", "mine", "hi", "-n", "2"], home=home)
    assert r.returncode == 0, r.stderr.decode()
    stored = Store(home / "models").get("mine")
    assert stored.files[0].mtime_ns == 1_000_000_000  # remembered: the next check hashes nothing
    # same size, other bytes, new time: the content decides, and it changed
    data = bytearray(synth_model.read_bytes())
    data[-1] ^= 0xFF
    copy.write_bytes(bytes(data))
    r = run_tallow(["run", "mine", "hi", "-n", "2"], home=home)
    assert r.returncode == 1 and b"changed since it was imported" in r.stderr


def test_import_refuses_a_bad_file_and_stores_nothing(tmp_path):
    home = tmp_path / "home"
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\xff" * 40)
    r = run_tallow(["import", str(bad)], home=home)
    assert r.returncode == 1 and b"error:" in r.stderr
    assert not (home / "models" / "manifests").exists() or not list((home / "models" / "manifests").rglob("*.json"))


@pytest.mark.parametrize("name", ["../x", "/etc/passwd", "a\x00b", "x/../../y", "", ".hidden", "a:b:c", "a//b"])
def test_hostile_names_are_rejected_before_any_path_is_built(name):
    with pytest.raises(InvalidName):
        parse_name(name)


def test_manifest_with_a_hostile_digest_or_name_is_refused(tmp_path):
    store = Store(tmp_path)
    path = store.manifests / "evil" / "latest.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"name": "evil", "files": [{"path": "x", "digest": "sha256-../../etc/passwd", "size": 1}]}))
    with pytest.raises(IntegrityError):
        store.get("evil")
    path.write_text(json.dumps({"name": "../evil", "files": [{"path": "x", "digest": "sha256-" + "0" * 64, "size": 1}]}))
    with pytest.raises(IntegrityError):
        store.get("evil")
    with pytest.raises(IntegrityError):
        Manifest.from_json({"name": "ok", "files": [{"path": "x", "digest": "sha256-" + "0" * 64, "size": 1,
                                                    "linked": "relative/path"}]})


PROBE = textwrap.dedent(
    """
    import sys
    def hook(event, args):
        if event.startswith("socket."):
            sys.stderr.write("SOCKET USED: " + event + "\\n")
            import os; os._exit(99)
    sys.addaudithook(hook)
    sys.argv = ["tallow"] + sys.argv[1:]
    from tallow.cli.app import main
    main()
    """
)


@pytest.mark.slow
def test_offline_no_command_opens_a_socket(synth_model, tmp_path):
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TALLOW_", "HF_"))}
    env.update(TALLOW_HOME=str(home), HF_ENDPOINT="http://127.0.0.1:9")
    commands = [  # (arguments, exit code); rm last, so every command before it sees the model
        (["list"], 0), (["show", "synth"], 0), (["run", "synth", "hi", "-n", "2"], 0),
        (["pull", "Org/Missing-GGUF:Q4_K_M"], 1), (["run", "Org/Missing-GGUF", "hi"], 1),
        (["pull", "smollm2:135m"], 1), (["pull", "Org/Missing-GGUF", "--list"], 1), (["find", "qwen"], 1),
        (["rm", "synth"], 0),
    ]
    for flag_env in ({"TALLOW_OFFLINE": "1"}, {"HF_HUB_OFFLINE": "1"}):
        assert run_tallow(["import", str(synth_model), "--name", "synth"], home=home).returncode == 0
        for args, code in commands:
            r = subprocess.run([sys.executable, "-c", PROBE, *args], env={**env, **flag_env}, capture_output=True, input=b"")
            err = r.stderr.decode()
            assert "SOCKET USED" not in err, (args, err)
            assert r.returncode == code, (args, err)
            if code:
                assert "offline mode is on" in err, (args, err)
