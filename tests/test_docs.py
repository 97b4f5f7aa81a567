"""The manual (docs/): its generated reference matches the code, every page names the
version it describes, and the site builds in strict mode (a broken link or anchor fails),
with nothing fetched when it is viewed."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.processes import run_tallow

from tallow.cli.reference import (
    BEGIN,
    END,
    PARAM_BEGIN,
    PARAM_END,
    VERSION_LINE,
    pages,
    render,
    render_parameters,
    section,
    version_line,
)

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
REGENERATE = "regenerate with: python -m tallow.cli.reference"


def test_command_reference_is_current():
    text = (DOCS / "reference" / "commands.md").read_text(encoding="utf-8")
    assert section(text, BEGIN, END), "docs/reference/commands.md has lost its markers"
    assert section(text, BEGIN, END) == render(), REGENERATE


def test_parameter_reference_is_the_field_table():
    text = (DOCS / "reference" / "parameters.md").read_text(encoding="utf-8")
    assert section(text, PARAM_BEGIN, PARAM_END) == render_parameters(), REGENERATE


def test_every_page_says_which_version_it_describes():
    found = {p.name: VERSION_LINE.search(p.read_text(encoding="utf-8")) for p in pages(DOCS)}
    assert len(found) >= 10 and all(found.values()), [name for name, m in found.items() if not m]
    assert {m.group(0) for m in found.values() if m} == {version_line()}, REGENERATE


def test_the_site_builds_strict_and_fetches_nothing_when_viewed(tmp_path):
    pytest.importorskip("mkdocs", reason="the docs extra (pip install '.[docs]') builds the site")
    site = tmp_path / "site"
    got = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300, env={"NO_MKDOCS_2_WARNING": "1",
                                                                                     "PATH": "/usr/bin:/bin"})
    assert got.returncode == 0, got.stderr[-3000:]
    built = {p.relative_to(site).as_posix() for p in site.rglob("*.html")}
    assert {"index.html", "running.html", "reference/commands.html"} <= built
    for page in site.rglob("*.html"):
        html = page.read_text(encoding="utf-8")
        # No web fonts, scripts or styles from elsewhere: only links a reader follows go out.
        remote = re.findall(r'<(?:script|link|img)[^>]+(?:src|href)="(https?://[^"]+)"', html)
        assert not remote, (page.name, remote[:3])


def test_a_broken_anchor_fails_the_build(tmp_path):
    pytest.importorskip("mkdocs", reason="the docs extra (pip install '.[docs]') builds the site")
    copy = tmp_path / "repo"
    copy.mkdir()
    for name in ("mkdocs.yml", "mkdocs_hooks.py"):
        (copy / name).write_text((ROOT / name).read_text())
    subprocess.run(["cp", "-r", str(DOCS), str(copy / "docs")], check=True)
    gpu = copy / "docs" / "gpu.md"
    gpu.write_text(gpu.read_text() + "\n[no such part](running.md#no-such-part)\n")
    got = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                         cwd=copy, capture_output=True, text=True, timeout=300, env={"NO_MKDOCS_2_WARNING": "1",
                                                                                     "PATH": "/usr/bin:/bin"})
    assert got.returncode != 0 and "no-such-part" in got.stderr


def test_tallow_docs_lists_the_pages_and_shows_one(tmp_path):
    listed = run_tallow(["docs"], home=tmp_path)
    assert listed.returncode == 0
    names = {line.split()[0] for line in listed.stdout.decode().splitlines()}
    assert {"running", "serving", "clients", "commands", "parameters"} <= names and "DESIGN" not in names
    shown = run_tallow(["docs", "clients"], home=tmp_path)  # not a terminal: the page's Markdown itself
    assert shown.returncode == 0 and shown.stdout.decode() == (DOCS / "clients.md").read_text(encoding="utf-8")
    where = run_tallow(["docs", "--path"], home=tmp_path)
    assert (Path(where.stdout.decode().strip()) / "running.md").is_file()
    bad = run_tallow(["docs", "nosuchpage"], home=tmp_path)
    assert bad.returncode == 2 and "no page 'nosuchpage'" in bad.stderr.decode() and "running" in bad.stderr.decode()


def test_tallow_docs_open_opens_the_built_site_or_says_how_to_build_it(tmp_path):
    seen = tmp_path / "opened"
    browser = tmp_path / "browser"
    browser.write_text(f"#!/bin/sh\necho \"$1\" > {seen}\n")
    browser.chmod(0o755)
    got = run_tallow(["docs", "serving", "--open"], home=tmp_path, env={"BROWSER": str(browser)})
    if (ROOT / "site" / "index.html").is_file():  # built in this checkout (mkdocs build)
        assert got.returncode == 0 and seen.read_text().strip() == (ROOT / "site" / "serving.html").as_uri()
    else:  # a fresh clone: nothing built, nothing opened
        assert got.returncode == 1 and "mkdocs build" in got.stderr.decode() and not seen.exists()
