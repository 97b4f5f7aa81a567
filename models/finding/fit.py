"""Which of a hub repository's quantizations fits this machine, judged before a byte of
weights is downloaded.

One header is read by range (the smallest quantization's: every quantization of a
repository shares its shape, its vocabulary and so its header), and the memory planner
(models/memory.py) prices a load at the default context. What the planner adds beside the
weights (KV cache, compute and output buffers) depends on the shape alone, so each
quantization's need is its own tensor bytes plus that overhead: one range read per
repository, however many quantizations it has.
"""

from __future__ import annotations

from dataclasses import dataclass

from tallow.models.errors import TallowError
from tallow.models.gguf_file import GGUFInfo, HeaderIncomplete, parse_prefix
from tallow.models.hub import Hub, HubFile, model_groups, quant_of, read_head
from tallow.models.memory import VRAM_MARGIN, Shape, estimate, human

HEADER_READ = 8 << 20  # the first range read of a header (a 150k-token vocabulary takes ~4 MB)
HEADER_MAX = 256 << 20


@dataclass(frozen=True)
class Budget:
    """What a load may use here: free RAM, a GPU's free memory (None: no GPU), and the
    context a load gets by default."""

    ram: int
    vram: int | None
    ctx_cap: int

    def room(self) -> int:
        return self.ram + max(0, (self.vram or 0) - VRAM_MARGIN)

    def words(self) -> str:
        gpu = f" and {human(self.vram)} of GPU memory" if self.vram else ""
        return f"{human(self.ram)} of free memory{gpu}"


@dataclass(frozen=True)
class Variant:
    """One quantization of a repository: its files (shards in order) and what a load needs."""

    key: str  # the file, or the first shard's name without its shard number
    quant: str  # "Q4_K_M", or "?" for a name that says none
    files: tuple[HubFile, ...]
    need: int | None  # bytes at the default context; None: the header could not be read
    n_ctx: int = 0
    where: str = "?"  # "gpu" (all of it on the GPU), "gpu+ram", "ram", "no", "?"

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def fits(self) -> bool:
        return self.where in ("gpu", "gpu+ram", "ram")

    def to_json(self) -> dict:
        return {"quant": self.quant, "file": self.key, "size": self.size, "need": self.need, "context": self.n_ctx,
                "fits": self.fits if self.need is not None else None, "where": self.where}


def remote_headers(hub: Hub, repo: str, files) -> list[GGUFInfo] | None:
    """The GGUF headers of `files` (a model's shards), read from the hub by range; None where
    one cannot be had (a download then checks the file itself)."""
    infos = []
    for f in files:
        n = min(HEADER_READ, f.size)
        while True:
            try:
                infos.append(parse_prefix(read_head(hub.opener(repo, f.path), n), f.size, f.path))
                break
            except HeaderIncomplete as more:
                if n >= min(f.size, HEADER_MAX):
                    return None
                n = min(max(2 * n, more.needed + (1 << 20)), f.size, HEADER_MAX)
            except (TallowError, OSError):
                return None
    return infos


def variants(hub: Hub, repo: str, files: list[HubFile], budget: Budget) -> tuple[list[Variant], list[GGUFInfo] | None]:
    """Every quantization of a repository's GGUF `files`, smallest first, each with its
    verdict; and the headers that were read (None: none could be)."""
    groups = sorted(model_groups(files).items(), key=lambda kv: sum(f.size for f in kv[1]))
    if not groups:
        return [], None
    headers = remote_headers(hub, repo, groups[0][1])
    if headers is None:
        return [Variant(key, quant_of(key) or "?", tuple(parts), None) for key, parts in groups], None
    shape = Shape.from_gguf(headers)
    n_ctx = min(shape.n_ctx_train or budget.ctx_cap, budget.ctx_cap)
    est = estimate(shape, n_ctx)
    overhead = est.total - est.weights
    not_tensors = sum(f.size for f in groups[0][1]) - shape.weights  # headers and padding, alike in every quantization
    out = []
    for key, parts in groups:
        need = max(0, sum(f.size for f in parts) - not_tensors) + overhead
        out.append(Variant(key, quant_of(key) or "?", tuple(parts), need, est.n_ctx, _where(need, budget)))
    return out, headers


def _where(need: int, budget: Budget) -> str:
    if budget.vram and need <= budget.vram - VRAM_MARGIN:
        return "gpu"
    if need <= budget.ram:
        return "ram"
    return "gpu+ram" if need <= budget.room() else "no"


def largest_fitting(found: list[Variant]) -> Variant | None:
    """The quantization with the most bits that still fits (None: none does, or none could be judged)."""
    fitting = [v for v in found if v.fits]
    return max(fitting, key=lambda v: v.size) if fitting else None


def why(chosen: Variant, found: list[Variant], budget: Budget) -> str:
    """One line on a choice made for the user: which, and why that one."""
    bigger = [v for v in found if v.size > chosen.size]
    tail = f"; {', '.join(v.quant for v in bigger)} would not" if bigger else " (the largest there is)"
    return (f"chose {chosen.quant}: the largest of {len(found)} quantizations that fits in {budget.words()} "
            f"(it needs {human(chosen.need or 0)} with a {chosen.n_ctx}-token context){tail}")


def none_fits(repo: str, found: list[Variant], budget: Budget) -> TallowError:
    judged = [v for v in found if v.need is not None]
    if not judged:
        return TallowError(f"cannot tell which of {repo}'s quantizations fits: their headers could not be read",
                           f"name one (tallow pull {repo}:{found[0].quant}), or see them with tallow pull {repo} --list")
    smallest = min(judged, key=lambda v: v.size)
    return TallowError(f"none of {repo}'s {len(found)} quantizations fits in {budget.words()}: the smallest, "
                       f"{smallest.quant}, needs {human(smallest.need or 0)} with a {smallest.n_ctx}-token context",
                       f"pull one with --force to download it anyway (tallow pull {repo}:{smallest.quant} --force)")
