"""The installable package: one import package `tallow`, and a start-up that stays light."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # building and installing a wheel

ROOT = Path(__file__).resolve().parent.parent


def test_wheel_installs_only_the_tallow_package(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path / "dist"), str(ROOT)], check=True, capture_output=True)
    wheel = next((tmp_path / "dist").glob("tallow-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"tallow", wheel.name.split("-")[0] + "-" + wheel.name.split("-")[1] + ".dist-info"}
    for pkg in ("cli", "serve", "runtime", "models", "quantize", "common"):
        assert f"tallow/{pkg}/__init__.py" in names
    assert "tallow/__init__.py" not in names  # a namespace: no modules of its own
    assert "tallow/quantize/data/eval.txt" in names  # `tallow eval` works offline from a wheel install
    static = Path(ROOT / "serve" / "ui" / "static")
    for page_file in static.rglob("*.*"):  # the chat page and its vendored libraries, licences included
        assert "tallow/serve/ui/static/" + str(page_file.relative_to(static)) in names
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
                   check=True, capture_output=True)
    installed = {p.name for p in target.iterdir()} - {"bin"}
    assert not installed & {"cli", "serve", "runtime", "models", "quantize", "common", "tests"}
    assert "tallow" in installed
    entry = (next(target.glob("tallow-*.dist-info")) / "entry_points.txt").read_text()
    assert "tallow = tallow.cli.entry:main" in entry


def _imports_after(args: list[str]) -> str:
    code = ("import sys, runpy; sys.argv = ['tallow'] + %r\n"
            "try:\n    runpy.run_module('tallow.cli', run_name='__main__')\n"
            "except SystemExit:\n    pass\n"
            "print('LOADED' if 'llama_cpp' in sys.modules else 'CLEAN', file=sys.stderr)") % args
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    return r.stdout + r.stderr


def test_help_and_version_never_import_llama_cpp():
    for args in (["--help"], ["--version"], ["run", "--help"]):
        out = _imports_after(args)
        assert "CLEAN" in out, (args, out)
    assert "tallow 0.1.0" in _imports_after(["--version"])


def test_root_help_lists_every_environment_variable():
    from tallow.env.settings import REGISTRY

    r = subprocess.run([sys.executable, "-m", "tallow.cli", "--help"], capture_output=True, text=True)
    assert r.returncode == 0
    for setting in REGISTRY:
        assert setting.name in r.stdout
