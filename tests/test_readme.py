"""The README opens with the commands CI runs, and is a short front door into docs/."""

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


def test_readme_is_a_front_door_of_at_most_300_lines_linking_into_the_manual():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 300
    linked = set(re.findall(r"\]\(docs/([\w/]+\.md)", readme))
    pages = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")}
    assert linked <= pages, linked - pages
    assert pages - linked <= {"DESIGN.md"} | set(), pages - linked  # every page of the manual is one click away
