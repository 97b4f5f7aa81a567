"""Ten minutes of mixed load and hostile habits against one tallow serve (the soak harness,
tests/benchmarks/soak.py, which says what it does and what fails it): it must end with its
books balanced, nothing left behind and no growth after warm-up."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # ten minutes

SOAK = Path(__file__).resolve().parent / "benchmarks" / "soak.py"


def test_ten_minutes_of_mixed_load_lose_nothing():
    pytest.importorskip("anthropic")
    pytest.importorskip("ollama")
    got = subprocess.run([sys.executable, str(SOAK), "--minutes", "10"], capture_output=True, text=True, timeout=1800)
    assert got.returncode == 0, got.stdout[-4000:] + got.stderr[-2000:]
    assert "soak: passed" in got.stdout and "requests by kind and outcome" in got.stdout
