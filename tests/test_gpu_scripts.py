"""The GPU lane's scripts (tests/gpu/): they parse, and shellcheck finds nothing in them."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).parent / "gpu").glob("*.sh"))


def test_the_scripts_exist_and_parse():
    assert {p.name for p in SCRIPTS} >= {"vulkan-lane.sh", "cuda-check.sh"}
    for script in SCRIPTS:
        assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0, script


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed (.ci/run installs it)")
def test_shellcheck_finds_nothing():
    done = subprocess.run(["shellcheck", *map(str, SCRIPTS)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout
