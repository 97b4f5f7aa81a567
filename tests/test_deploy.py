"""docs/deploy.md's configurations are real: nginx and HAProxy accept them, the systemd unit
verifies and its command line parses as tallow's own, and a streamed request goes through
the nginx configuration to a replica (a draining replica's 503 sent on to the next one)."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.server import Server
from helpers.standin import StandIn

pytestmark = pytest.mark.slow  # nginx, HAProxy and a server behind them

DOC = Path(__file__).resolve().parent.parent / "docs" / "deploy.md"


def block(lang: str) -> str:
    found = re.findall(rf"```{lang}\n(.*?)```", DOC.read_text(), re.S)
    assert len(found) == 1, f"one {lang} block in docs/deploy.md"
    return found[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def need(tool: str) -> str:
    path = shutil.which(tool) or (f"/usr/sbin/{tool}" if Path(f"/usr/sbin/{tool}").exists() else None)
    if path is None:
        pytest.skip(f"{tool} is not installed (.ci/run installs it)")
    return path


def test_nginx_accepts_the_config(tmp_path):
    nginx = need("nginx")
    conf = tmp_path / "nginx.conf"
    conf.write_text(block("nginx"))
    got = subprocess.run([nginx, "-t", "-p", str(tmp_path), "-c", str(conf), "-e", "stderr"], capture_output=True,
                         text=True, timeout=60)
    assert got.returncode == 0 and "syntax is ok" in got.stderr, got.stderr


def test_haproxy_accepts_the_config(tmp_path):
    haproxy = need("haproxy")
    conf = tmp_path / "haproxy.cfg"
    conf.write_text(block("haproxy"))
    got = subprocess.run([haproxy, "-c", "-f", str(conf)], capture_output=True, text=True, timeout=60)
    assert got.returncode == 0, got.stdout + got.stderr
    assert "option httpchk GET /ready" in block("haproxy")


def test_the_systemd_unit_verifies_and_its_command_is_tallows(tmp_path):
    unit = block("ini")
    keys: dict[str, list[str]] = {}
    for line in unit.splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            k, _, v = line.partition("=")
            keys.setdefault(k.strip(), []).append(v.strip())
    argv = keys["ExecStart"][0].split()
    assert argv[0].endswith("/tallow") and argv[1] == "serve"
    import typer.main

    from tallow.cli.app import app

    group = typer.main.get_command(app)
    ctx = group.make_context("tallow", ["serve"], resilient_parsing=True)
    serve = group.get_command(ctx, "serve")
    parsed = serve.make_context("serve", argv[2:])  # raises on a flag or value tallow does not take
    assert parsed.params["host"] == "0.0.0.0" and parsed.params["drain_timeout"] < float(keys["TimeoutStopSec"][0])
    assert keys["KillMode"] == ["mixed"] and keys["KillSignal"] == ["SIGTERM"]
    analyze = shutil.which("systemd-analyze")
    if analyze:
        real = unit.replace(argv[0], str(Path(sys.executable).parent / "tallow"))
        path = tmp_path / "tallow-replica.service"
        path.write_text(real)
        got = subprocess.run([analyze, "verify", str(path)], capture_output=True, text=True, timeout=120)
        assert got.returncode == 0, got.stdout + got.stderr


def test_a_stream_through_the_nginx_config_and_a_503_passed_on(synth_model, tmp_path):
    nginx = need("nginx")
    openai = pytest.importorskip("openai")
    replica = Server(synth_model, tmp_path / "home", "--parallel", "2")
    draining = StandIn()
    draining.fail_next = [503] * 100  # answers as a draining replica does
    port = free_port()
    conf = block("nginx")
    upstreams = re.findall(r"^\s*server 10\.0\.0\.\d+:8080.*$", conf, re.M)
    assert len(upstreams) == 3
    conf = conf.replace(upstreams[0], f"        server {replica.url.split('//')[1]};")
    conf = conf.replace(upstreams[1], f"        server 127.0.0.1:{draining.url.split(':')[2].split('/')[0]};")
    conf = conf.replace(upstreams[2] + "\n", "")
    conf = conf.replace("listen 8080;", f"listen 127.0.0.1:{port};")
    conf = conf.replace("events {}", f"pid {tmp_path}/nginx.pid;\nevents {{}}")
    (tmp_path / "nginx.conf").write_text(conf)
    proc = subprocess.Popen([nginx, "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf"), "-e", "stderr",
                             "-g", "daemon off;"], stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 1).close()
                break
            except OSError:
                assert time.monotonic() < deadline and proc.poll() is None, "nginx did not start"
                time.sleep(0.05)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=120)
        for i in range(4):  # least_conn alternates: half of them meet the 503 first
            chunks = list(client.chat.completions.create(
                model="tallow", messages=[{"role": "user", "content": f"hello {i}"}], max_tokens=8, stream=True,
                extra_body={"ignore_eos": True}, stream_options={"include_usage": True}))
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            assert text and chunks[-1].usage.completion_tokens == 8
        whole = client.chat.completions.create(model="tallow", messages=[{"role": "user", "content": "hi"}],
                                               max_tokens=4)
        assert whole.choices[0].message.content is not None
        assert draining.bodies, "nginx never tried the draining upstream"
    finally:
        proc.terminate()
        proc.wait(30)
        draining.close()
        replica.close()


def test_the_kuberay_manifest_is_a_raycluster_of_tallow_engines():
    import yaml  # Ray's own dependency (tallow[ray] is in the test extras)

    doc = yaml.safe_load(block("yaml"))
    assert doc["apiVersion"] == "ray.io/v1" and doc["kind"] == "RayCluster"
    spec = doc["spec"]
    assert spec["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0", "engines stay off the head"
    pods = [spec["headGroupSpec"]["template"]["spec"]] + [g["template"]["spec"] for g in spec["workerGroupSpecs"]]
    for pod in pods:
        (container,) = pod["containers"]
        env = {e["name"]: e["value"] for e in container["env"]}
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        assert env["TALLOW_HOME"].startswith(mounts["models"] + "/"), "the store on the shared volume, same path"
        assert env["TALLOW_OFFLINE"] == "1", "nothing downloaded on a node"
        assert any(v["name"] == "models" and "persistentVolumeClaim" in v for v in pod["volumes"])
    worker = spec["workerGroupSpecs"][0]
    cpus = worker["rayStartParams"]["num-cpus"]
    assert worker["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"] == cpus


def test_the_ray_commands_in_the_guide_are_tallows(tmp_path):
    """Every `tallow batch|serve ... --ray` line of docs/deploy.md parses with tallow's own parser."""
    import shlex

    import typer.main

    from tallow.cli.app import app

    text = DOC.read_text().replace("\\\n", " ")
    group = typer.main.get_command(app)
    checked = 0
    for name in ("batch", "serve"):
        lines = [line.split(f"tallow {name}", 1)[1] for line in text.splitlines()
                 if "$ " in line and f"tallow {name} " in line and "--ray" in line]  # the console examples
        ctx = group.make_context("tallow", [name], resilient_parsing=True)
        command = group.get_command(ctx, name)
        for line in lines:
            parsed = command.make_context(name, shlex.split(line))  # raises on a flag or value tallow does not take
            assert parsed.params["ray"] in ("auto", "local") or ":" in parsed.params["ray"]
            checked += 1
    assert checked >= 3
