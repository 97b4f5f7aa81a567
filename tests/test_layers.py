"""The layers of docs/DESIGN.md hold in the code: who may import whom, where llama_cpp, the
environment, Rich and Typer may appear, and that no module takes another's private names."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# a package -> the tallow packages it may import (besides itself)
MAY_IMPORT = {
    "common": set(),
    "models": {"common"},
    "runtime": {"models", "common"},
    "quantize": {"runtime", "models", "common"},
    "serve": {"runtime", "models", "common"},
    "cli": {"serve", "runtime", "models", "quantize", "common"},
}


def modules():
    for pkg in MAY_IMPORT:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            yield pkg, path, ast.parse(path.read_text(encoding="utf-8"), str(path))


def imported(pkg: str, path: Path, tree: ast.AST):
    """(full module name, names taken from it) for every import in the file, relative ones resolved."""
    here = ["tallow", pkg, *path.relative_to(ROOT / pkg).with_suffix("").parts]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, []
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[:-node.level]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            yield name, [a.name for a in node.names]


def test_every_package_imports_only_the_layers_below_it():
    bad = []
    for pkg, path, tree in modules():
        for name, _ in imported(pkg, path, tree):
            parts = name.split(".")
            if parts[0] == "tallow" and len(parts) > 1 and parts[1] != pkg and parts[1] not in MAY_IMPORT[pkg]:
                bad.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not bad, bad


def test_llama_cpp_rich_typer_and_the_environment_stay_in_their_places():
    bad = []
    for pkg, path, tree in modules():
        rel = str(path.relative_to(ROOT))
        for name, _ in imported(pkg, path, tree):
            top = name.split(".")[0]
            if top == "llama_cpp" and rel != "runtime/backend.py":
                bad.append(f"{rel} imports llama_cpp")
            if top in ("rich", "typer") and pkg != "cli":
                bad.append(f"{rel} imports {top}")
        if pkg != "cli":
            for node in ast.walk(tree):
                if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv") and \
                        isinstance(node.value, ast.Name) and node.value.id == "os":
                    bad.append(f"{rel} reads the environment (line {node.lineno})")
    assert not bad, bad


def test_no_module_takes_another_module_s_private_names():
    bad = []
    for pkg, path, tree in modules():
        for name, names in imported(pkg, path, tree):
            if name.startswith("tallow."):
                bad += [f"{path.relative_to(ROOT)} takes {name}.{n}" for n in names
                        if n.startswith("_") and not n.startswith("__")]
    assert not bad, bad


def test_modules_stay_under_500_lines():
    long = [f"{p.relative_to(ROOT)}: {n}" for _, p, _ in modules() if (n := len(p.read_text().splitlines())) >= 500]
    assert not long, long
