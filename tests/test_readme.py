"""The README opens with the commands CI runs."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_readme_starts_with_install_and_test_commands_and_ci_runs_the_second():
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```sh\n(.*?)\n```", readme, flags=re.S)
    install, tests = blocks[0].strip(), blocks[1].strip()
    assert install.startswith("pip install . && tallow run smollm2:135m")
    ci = (ROOT / ".ci" / "run").read_text()
    assert f"TEST_COMMAND='{tests}'" in ci
    # the two commands come before any other section
    assert readme.index(tests) < readme.index("\n## ")


def test_command_reference_is_current():
    from tallow.cli.reference import render, section

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    assert section(readme), "the README has lost its reference markers"
    assert section(readme) == render(), "regenerate with: python -m tallow.cli.reference README.md"


def test_parameter_reference_is_the_field_table():
    from tallow.cli.reference import PARAM_BEGIN, PARAM_END, render_parameters, section

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    assert section(readme, PARAM_BEGIN, PARAM_END) == render_parameters(), \
        "regenerate with: python -m tallow.cli.reference README.md"
