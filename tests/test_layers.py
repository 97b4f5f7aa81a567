"""The layers of docs/DESIGN.md hold in the code: who may import whom, where llama_cpp, the
environment, Rich and Typer may appear, that no module takes another's private names, the
roles inside serve/ (the front holds no engine), and that no import cycle exists, not even
through imports inside functions."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# a package -> the tallow packages it may import (besides itself)
MAY_IMPORT = {
    "common": set(),
    "models": {"common"},
    "runtime": {"models", "common"},
    "quantize": {"runtime", "models", "common"},
    "wire": {"runtime", "models", "common"},
    "client": {"runtime", "common"},
    "jobs": {"client", "wire", "runtime", "models", "common"},
    "serve": {"wire", "runtime", "models", "common"},
    # the environment as the front doors see it: its variables, the machine profile, the places
    "env": {"runtime", "models", "common"},
    "cli": {"env", "serve", "jobs", "client", "wire", "runtime", "models", "quantize", "common"},
    # the public Python API: the environment's settings and the one way to open a model, without
    # the CLI, Typer or HTTP
    "api": {"env", "runtime", "models", "common"},
}
# inside serve/: the front (one process for many models) never loads an engine, the
# plumbing both apps share knows neither app, the chat page's routes (ui/) know neither, and
# the Ray Serve application (ray/) wraps the runner's app, never the front
SERVE_MAY_IMPORT = {"http": {"http"}, "front": {"front", "http", "ui"}, "runner": {"runner", "http"},
                    "ui": {"ui", "http"}, "ray": {"ray", "runner", "http"}}
ENGINE = ("tallow.runtime.scheduling.scheduler", "tallow.runtime.engine", "tallow.runtime.backend", "tallow.runtime.sequence",
          "tallow.runtime.embedding")


def modules():
    for pkg in MAY_IMPORT:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            yield pkg, path, ast.parse(path.read_text(encoding="utf-8"), str(path))


def module_name(pkg: str, path: Path) -> str:
    parts = ["tallow", pkg, *path.relative_to(ROOT / pkg).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(top_level_only: bool = False) -> dict[str, set[str]]:
    """Every tallow module -> the tallow modules it imports, at the top or (unless
    `top_level_only`) inside a function (`from pkg import mod` counts as importing the module)."""
    found = {module_name(pkg, path): (pkg, path, tree) for pkg, path, tree in modules()}
    graph: dict[str, set[str]] = {name: set() for name in found}
    for name, (pkg, path, tree) in found.items():
        for target, names in imported(pkg, path, tree, top_level_only):
            for candidate in (target, *(f"{target}.{n}" for n in names)):
                if candidate in found and candidate != name:
                    graph[name].add(candidate)
    return graph


def imported(pkg: str, path: Path, tree: ast.AST, top_level_only: bool = False):
    """(full module name, names taken from it) for every import in the file, relative ones
    resolved; with `top_level_only`, only the imports that run when the module is imported."""
    here = ["tallow", pkg, *path.relative_to(ROOT / pkg).with_suffix("").parts]
    if here[-1] == "__init__":  # a package's relative imports start from the package itself
        here = here[:-1] + ["__init__"]
    for node in _top_level(tree) if top_level_only else ast.walk(tree):
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


def _top_level(tree: ast.AST):
    """The nodes that run at import: everything but the bodies of functions."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            todo.extend(ast.iter_child_nodes(node))


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
            if top == "llama_cpp" and not rel.startswith("runtime/backend/"):
                bad.append(f"{rel} imports llama_cpp")
            if top in ("rich", "typer") and pkg != "cli":
                bad.append(f"{rel} imports {top}")
        if pkg not in ("cli", "env"):  # the front doors' registry of variables (env/settings.py)
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


def test_commands_stay_thin():
    """No function in cli/ over 60 lines: flags come in typed groups (cli/flag_groups.py), the
    work in the layers below."""
    long = [f"{p.relative_to(ROOT)}:{node.lineno} {node.name}: {node.end_lineno - node.lineno + 1} lines"
            for pkg, p, tree in modules() if pkg == "cli" for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > 60]
    assert not long, long


def test_no_package_holds_more_than_20_flat_modules():
    """Rooms with walls: a package grows sub-packages by role before it becomes a hall."""
    crowded = []
    for pkg in MAY_IMPORT:
        for folder in [ROOT / pkg, *(d for d in (ROOT / pkg).rglob("*") if (d / "__init__.py").is_file())]:
            flat = [p for p in folder.glob("*.py") if p.name != "__init__.py"]
            if len(flat) > 20:
                crowded.append(f"{folder.relative_to(ROOT)}: {len(flat)}")
    assert not crowded, crowded


def test_the_design_document_names_every_module():
    design = (ROOT / "docs" / "DESIGN.md").read_text(encoding="utf-8")
    bullets = design.split("\n- ")  # a bullet may list a folder's modules by file name

    def named(path: Path) -> bool:
        rel = str(path.relative_to(ROOT))
        folder = str(path.parent.relative_to(ROOT)) + "/"
        return rel in design or any(f"`{folder}" in b and f"`{path.name}`" in b for b in bullets)

    missing = [str(p.relative_to(ROOT)) for _, p, _ in modules() if p.name != "__init__.py" and not named(p)]
    assert not missing, f"docs/DESIGN.md's module map lacks {missing}"


def test_serve_roles_keep_to_themselves():
    """The front and the runner app each import only the shared plumbing besides themselves;
    the wire formats import no HTTP framework; the clients of other servers none of serve/."""
    bad = []
    for pkg, path, tree in modules():
        rel = path.relative_to(ROOT)
        role = rel.parts[1] if pkg == "serve" and len(rel.parts) > 2 else None
        for name, _ in imported(pkg, path, tree):
            parts = name.split(".")
            if role in SERVE_MAY_IMPORT and parts[:2] == ["tallow", "serve"] and len(parts) > 2 and \
                    parts[2] in SERVE_MAY_IMPORT and parts[2] not in SERVE_MAY_IMPORT[role]:
                bad.append(f"{rel} ({role}) imports {name}")
            if pkg == "wire" and parts[0] in ("starlette", "uvicorn"):
                bad.append(f"{rel} (a wire format) imports {name}")
    assert not bad, bad


def test_the_front_never_loads_an_engine():
    """Followed through every import that runs when a module is imported: the front reaches
    no scheduler, engine, sequence core or backend (and, in a real process, llama_cpp)."""
    graph = import_graph(top_level_only=True)
    front = [m for m in graph if m.startswith("tallow.serve.front")]
    bad = []
    for start in front:
        seen, todo = {start}, [start]
        while todo:
            for nxt in graph[todo.pop()]:
                if nxt.startswith(ENGINE):
                    bad.append(f"{start} reaches {nxt}")
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
    assert not bad, sorted(set(bad))
    probe = ("import sys, tallow.serve.front.front_app, tallow.serve.front.pool, tallow.serve.front.registry; "
             f"print([m for m in sys.modules if m.startswith({ENGINE + ('llama_cpp',)!r})])")
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]", loaded


def test_wire_only_translates():
    """The APIs' formats (wire/) take bodies and give checked requests and answers: no function
    there is handed an engine, an embedder or a scheduler, or tokenizes; that is done once, in
    runtime/intake.py and runtime/embedding/intake.py."""
    found = []
    for pkg, path, tree in modules():
        if pkg != "wire":
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found += [f"{path.name}:{node.name}({a.arg})" for a in node.args.args + node.args.kwonlyargs
                          if a.arg in ("engine", "embedder", "sched", "scheduler")]
            if isinstance(node, ast.Attribute) and node.attr in ("tokenize", "detokenize", "engine", "embedder"):
                found.append(f"{path.name}:{node.lineno} .{node.attr}")
    assert not found, found


def test_no_import_cycles_even_inside_functions():
    graph = import_graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    assert not cycles, cycles
