"""Where an engine on a cluster node (a `batch --ray` actor, a `serve --ray` replica) gets
its weights (docs/DESIGN.md, "Batch files on Ray").

The driver names every file the engine loads (the model's shards, its projector, a draft
model, adapters) by path, size and SHA-256. On each node an actor uses, in this order:
1. the same path, when the file there has that size and digest: a store or folder on a
   shared filesystem, or each node's own store pulled beforehand from the team's mirror
   (a store names its blobs by digest, so the same model has the same path under the same
   TALLOW_HOME on every node);
2. the bytes the driver put into Ray's object store, written once per node to a folder
   keyed by digest: with `auto`, a file up to `ship_max` that some node lacked (the actor
   says so, the driver ships it once and starts the actor again); `--ray-weights ship`
   ships every file from the start and no node uses its own copy;
3. otherwise nothing: the actor fails to start with a message naming the node and the file.
Nothing is ever downloaded on a node: a node without the file is an error, not a pull.
"""

from __future__ import annotations

import os
import re
import tempfile
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

from tallow.common.errors import TallowError
from tallow.common.files import sha256_file
from tallow.runtime.types import LoadSettings

WEIGHT_MODES = ("auto", "path", "ship")
_BLOB_NAME = re.compile(r"sha256-([0-9a-f]{64})")
_node_lock = threading.Lock()  # actors of one process (a local cluster's) write a shipped file once


class Missing(TallowError):
    """A node lacks a file that was not shipped (with `auto`, the driver may ship it now)."""

    def __init__(self, message: str, hint: str, path: str) -> None:
        super().__init__(message, hint)
        self.path = path


@dataclass(frozen=True)
class WeightFile:
    path: str  # on the driver
    size: int
    sha256: str
    blob: Any = None  # an object reference to the file's bytes, when shipped
    by_path: bool = True  # whether a node may use its own file at `path` (not with "ship")

    @property
    def name(self) -> str:
        return Path(self.path).name


def digest_of(path: Path) -> str:
    """A file's SHA-256: a store blob is named by it (the store checked it when it pulled)."""
    found = _BLOB_NAME.fullmatch(path.name)
    return found.group(1) if found else sha256_file(path)


def load_files(load: LoadSettings, model_paths: list[Path]) -> list[Path]:
    """Every file an engine loaded with `load` reads."""
    extra = [load.mmproj] if load.mmproj is not None else []
    return [*model_paths, *extra, *load.draft, *(spec.path for spec in load.loras)]


def plan(files: list[Path], mode: str, put: Callable[[bytes], Any]) -> dict[str, WeightFile]:
    """Each file by its driver path; with mode "ship", its bytes put (ray.put) in the object store."""
    if mode not in WEIGHT_MODES:
        raise TallowError(f"unknown --ray-weights {mode!r}: use one of {', '.join(WEIGHT_MODES)}")
    out: dict[str, WeightFile] = {}
    for path in files:
        w = WeightFile(str(path), path.stat().st_size, digest_of(path))
        out[str(path)] = shipped(w, put) if mode == "ship" else w
    return out


def shipped(w: WeightFile, put: Callable[[bytes], Any], by_path: bool = False) -> WeightFile:
    """`w` with its bytes in the object store, for nodes that lack it (`by_path`: a node
    that has the file at the driver's path still loads that)."""
    return replace(w, blob=put(Path(w.path).read_bytes()), by_path=by_path)


def may_ship(w: WeightFile, mode: str, ship_max: int) -> bool:
    """Whether a file some node lacks is shipped now (auto, small enough, not shipped yet)."""
    return mode == "auto" and w.blob is None and w.size <= ship_max


def node_path(w: WeightFile, cache_dir: Path | None, node: str, fetch: Callable[[Any], bytes]) -> tuple[Path, str]:
    """(the file to load on this node, where it came from: "path" or "shipped")."""
    here = Path(w.path)
    if w.by_path and _same(here, w):
        return here, "path"
    if w.blob is None:
        raise Missing(f"node {node} has no copy of {w.name} at {w.path} (or not the same file), and it was not "
                      "shipped", "put the store on a shared filesystem or pull the model on every node under the "
                      "same TALLOW_HOME (docs/deploy.md), or run with --ray-weights ship", w.path)
    folder = cache_dir or Path(tempfile.gettempdir()) / "tallow-ray-weights"
    target = folder / f"sha256-{w.sha256}"
    with _node_lock:
        if not _same(target, w):
            folder.mkdir(parents=True, exist_ok=True)
            part = folder / f".{target.name}.{os.getpid()}.part"
            part.write_bytes(fetch(w.blob))
            if not _same(part, w, verify=True):
                part.unlink(missing_ok=True)
                raise TallowError(f"the shipped copy of {w.name} on node {node} does not match its digest")
            os.replace(part, target)
    return target, "shipped"


def _same(path: Path, w: WeightFile, verify: bool = False) -> bool:
    """Whether `path` holds w's bytes: its size, and its digest (trusted from a store blob's name)."""
    try:
        if path.stat().st_size != w.size:
            return False
    except OSError:
        return False
    if not verify and _BLOB_NAME.fullmatch(path.name) and path.name == f"sha256-{w.sha256}":
        return True
    return sha256_file(path) == w.sha256


def on_node(load: LoadSettings, files: dict[str, Path]) -> LoadSettings:
    """`load` with every file replaced by its copy on this node."""
    def here(path: Path) -> Path:
        return files[str(path)]

    return replace(load, mmproj=None if load.mmproj is None else here(load.mmproj),
                   draft=tuple(here(p) for p in load.draft),
                   loras=tuple(replace(spec, path=here(spec.path)) for spec in load.loras))


def load_on_node(model_paths: tuple[str, ...], weights: dict[str, WeightFile], load: LoadSettings, sched_settings,
                 node: str, fetch: Callable[[Any], bytes]):
    """(a Scheduler loaded from this node's copies, {file name: "path" | "shipped"});
    Missing when this node lacks a file that was not shipped."""
    from tallow.runtime.scheduling.scheduler import Scheduler

    files: dict[str, Path] = {}
    sources: dict[str, str] = {}
    for key, w in weights.items():
        files[key], sources[w.name] = node_path(w, None, node, fetch)  # shipped copies: the temp folder
    sched = Scheduler.load([files[p] for p in model_paths], on_node(load, files), sched_settings)
    sched.engine.digest = weights[model_paths[0]].sha256
    return sched, sources


def node_name(ray) -> str:
    """This Ray worker's node: its address and the start of its id (one machine may hold several)."""
    node_id = ray.get_runtime_context().get_node_id()
    address = next((n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == node_id), "?")
    return f"{address} ({node_id[:8]})"
