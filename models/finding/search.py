"""Search the hub for GGUF repositories and judge each one against this machine.

The hub's search answers with each repository's own facts (downloads, likes, licence, and
its `gguf` summary: architecture, parameters, context); filters the hub cannot apply
(architecture, size) are applied here, reading further pages until enough results pass.
Each result then costs two requests, its file listing and one header read (fit.py); they
run side by side, so twenty results take about as long as the slowest one.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Callable

from tallow.models.errors import TallowError
from tallow.models.finding.fit import Budget, Variant, largest_fitting, variants
from tallow.models.hub import SORTS, Hub, Listing

SCAN = 10  # with filters: hub listings read per result wanted, at most
WORKERS = 8  # results judged at once


@dataclass(frozen=True)
class Filters:
    architecture: str | None = None
    min_params: int | None = None
    max_params: int | None = None

    @property
    def active(self) -> bool:
        return any(v is not None for v in (self.architecture, self.min_params, self.max_params))

    def admits(self, listing: Listing) -> bool:
        if self.architecture is not None and (listing.architecture or "").lower() != self.architecture.lower():
            return False
        n = listing.parameters
        if (self.min_params is not None or self.max_params is not None) and n is None:
            return False  # a size filter asks for a known size
        return not ((self.min_params is not None and n < self.min_params)  # type: ignore[operator]
                    or (self.max_params is not None and n > self.max_params))  # type: ignore[operator]


@dataclass(frozen=True)
class Result:
    listing: Listing
    variants: tuple[Variant, ...]
    best: Variant | None  # the largest that fits
    supported: bool | None  # does the installed llama.cpp know the architecture (None: cannot tell)
    problem: str | None = None  # why the repository could not be judged

    def to_json(self) -> dict:
        return {**asdict(self.listing), "supported": self.supported, "best": self.best.quant if self.best else None,
                "quantizations": [v.to_json() for v in self.variants], "problem": self.problem}


def search(hub: Hub, query: str, *, sort: str = "downloads", limit: int = 20, filters: Filters = Filters(),
           budget: Budget, supports: Callable[[str], bool | None] = lambda arch: None) -> list[Result]:
    """The hub's GGUF repositories for `query`, at most `limit`, each judged for this machine."""
    if sort not in SORTS:
        raise TallowError(f"unknown sort {sort!r}", f"use one of {', '.join(SORTS)}")
    if limit < 1:
        raise TallowError("the limit must be at least 1")
    found: list[Listing] = []
    for listing in hub.search(query, sort, limit * SCAN if filters.active else limit):
        if filters.admits(listing):
            found.append(listing)
            if len(found) == limit:
                break
    if not found:
        return []
    with ThreadPoolExecutor(min(WORKERS, len(found))) as pool:
        return list(pool.map(lambda listing: judge(hub, listing, budget, supports), found))


def judge(hub: Hub, listing: Listing, budget: Budget, supports: Callable[[str], bool | None]) -> Result:
    """One repository: its quantizations with their verdicts; a repository that cannot be
    read (gated, gone) is kept, with the reason."""
    try:
        files = [f for f in hub.list_files(listing.repo, probe=False) if f.path.lower().endswith(".gguf")]
        found, headers = variants(hub, listing.repo, files, budget)
    except TallowError as exc:
        return Result(listing, (), None, _supported(listing.architecture, supports), exc.message)
    if headers and (listing.architecture is None or listing.parameters is None):
        listing = Listing(**{**asdict(listing), "architecture": listing.architecture or headers[0].architecture,
                             "parameters": listing.parameters or sum(h.n_params for h in headers)})
    return Result(listing, tuple(found), largest_fitting(found), _supported(listing.architecture, supports))


def _supported(arch: str | None, supports: Callable[[str], bool | None]) -> bool | None:
    return supports(arch) if arch else None
