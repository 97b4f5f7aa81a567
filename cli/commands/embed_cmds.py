"""tallow embed, search and tokenize: vectors for texts, the nearest stored texts to a query, and
a text's tokens."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Callable, Iterator, Optional

import typer

from tallow.cli import options as o
from tallow.cli.flag_groups import EndpointFlags, with_groups
from tallow.cli.render import animated, err_console, out_console
from tallow.common.errors import TallowError


@with_groups(server=EndpointFlags)
def embed(
    model: o.Model,
    texts: Optional[list[str]] = typer.Argument(None, help="Texts to embed [default: one per line from stdin].", show_default=False),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write here instead of stdout; JSONL is appended to and resumes after the last index written.", show_default=False),
    fmt: str = typer.Option("jsonl", "--format", help="jsonl ({index, text, embedding} per line), json (one array) or npy (a float32 matrix)."),
    index: Optional[Path] = typer.Option(None, "--index", help="Store the texts and vectors in this SQLite file for tallow search (texts already there are skipped).", show_default=False),
    no_text: bool = typer.Option(False, "--no-text", help="Leave the text out of JSONL and JSON records."),
    dimensions: o.Dimensions = None,
    no_normalize: o.NoNormalize = False,
    pooling: o.Pooling = None,
    truncate: o.Truncate = False,
    batch_size: o.EmbedBatch = 512,
    threads: o.Threads = None,
    gpu_layers: o.GpuLayers = "auto",
    offline: o.Offline = False,
    *, server: EndpointFlags,
) -> None:
    """Embed texts: one vector per text, or an index to search.

    Inputs are packed many to a decode. An input longer than the model takes is an error
    naming its index unless --truncate. A run killed midway resumes with the same -o. With
    --endpoint, a server's /v1/embeddings makes the vectors.

    Example: tallow embed all-minilm:l6-v2 --index notes.sqlite < notes.txt
    """
    from tallow.cli.models import open_embedder
    from tallow.jobs.embed_run import EmbedStats, numbered_lines, open_sink, run_embed
    from tallow.runtime.embedding.embed import Shaping

    _check(texts, output, fmt, index, no_text)
    remote = server.servers(offline)
    if remote:
        o.refuse_local({"--pooling": pooling is not None, "--truncate": truncate, "--batch-size": batch_size != 512,
                        "--threads": threads is not None, "--gpu-layers": gpu_layers != "auto"})
        local, embedder = _remote(remote[0], model)
    else:
        local, embedder = open_embedder(model, o.embed_settings(threads, gpu_layers, pooling, batch_size), offline)
    try:
        embedder.check_dimensions(dimensions)
        if embedder.ranks:
            raise TallowError(f"{local.name} is a reranker (pooling rank): it scores pairs, it makes no vectors",
                              "serve it and use /v1/rerank, or embed with --pooling mean")
        shaping = Shaping(normalize=not no_normalize, dimensions=dimensions)
        inputs = enumerate(texts) if texts else numbered_lines(sys.stdin.buffer)
        meta = {"model": local.name, "model_sha256": local.sha256 or "", "pooling": embedder.pooling,
                "dimensions": str(dimensions or embedder.width), "normalized": str(not no_normalize).lower(),
                **({"endpoint": remote[0].url} if remote else {})}
        sink, skip = open_sink(fmt, output, index, meta, with_text=not no_text)
        stats = EmbedStats()
        try:
            with _progress() as show:
                run_embed(embedder, inputs, sink, shaping, truncate, stats, skip, show)
        except BaseException:
            sink.abandon()
            raise
        sink.close()
    finally:
        embedder.close()
    _said(stats, f" into {index}" if index else f" to {output}" if output else "",
          stats.tokens if not remote else embedder.prompt_tokens)  # remote: the server's count


def _said(stats, where: str, tokens: int | None) -> None:
    skipped = f", {stats.skipped} already there" if stats.skipped else ""
    shown = "tokens not reported" if tokens is None else f"{tokens} tokens"
    err_console().print(f"{stats.done} embedded{where}{skipped}; {shown} at {stats.per_s:.1f} inputs/s",
                        soft_wrap=True)


def _check(texts: list[str] | None, output: Path | None, fmt: str, index: Path | None, no_text: bool) -> None:
    """The inputs and the outputs' flags, refused by name before anything loads."""
    from tallow.jobs.embed_run import FORMATS

    if fmt not in FORMATS:
        raise typer.BadParameter(f"must be jsonl, json or npy, not {fmt!r}", param_hint="--format")
    if index is not None and (output is not None or fmt != "jsonl" or no_text):
        raise TallowError("--index stores the vectors; it takes none of --output, --format and --no-text")
    if fmt == "npy" and output is None and sys.stdout.isatty():
        raise TallowError("a .npy file is binary", "give -o FILE.npy, or redirect stdout")
    if output is not None and output.is_dir():
        raise typer.BadParameter(f"{output} is a folder", param_hint="--output")
    if texts and any(not t.strip() for t in texts):
        raise TallowError(f"text {next(i for i, t in enumerate(texts) if not t.strip())} is empty",
                          "every text needs some words")


def _remote(endpoint, model: str):
    """(what stands for the local model in the records, the server's embedder)."""
    from types import SimpleNamespace

    from tallow.client.remote_embed import RemoteEmbedder

    return SimpleNamespace(name=model, sha256=None), RemoteEmbedder(endpoint, model)


@contextlib.contextmanager
def _progress() -> Iterator[Callable]:
    """Inputs done and the rate on a terminal (the total is not known while stdin streams)."""
    console = err_console()
    if not animated(console):
        yield lambda stats: None
        return
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("embed"), BarColumn(), TextColumn("{task.completed} inputs {task.fields[rate]}"),
                  TimeElapsedColumn(), console=console, transient=True) as progress:
        task = progress.add_task("embed", total=None, rate="")

        def show(stats) -> None:
            progress.update(task, completed=stats.done + stats.skipped, rate=f"{stats.per_s:.0f}/s")

        yield show


def search(
    index: Path = typer.Argument(..., help="An index made by tallow embed --index.", show_default=False),
    query: str = typer.Argument(..., help="What to look for.", show_default=False),
    n: int = typer.Option(10, "-n", "--top", min=1, max=10_000, help="How many texts to return."),
    json_out: o.JsonList = False,
    threads: o.Threads = None,
    offline: o.Offline = False,
    api_key: o.EndpointKey = None,
) -> None:
    """Find the stored texts nearest to a query.

    The query is embedded with the model that made the index (by the same server, when
    tallow embed --endpoint made it), and every stored vector is scored by cosine
    similarity (exact search).

    Example: tallow search notes.sqlite "how do I reset my password" -n 5
    """
    hits = nearest(index, query, n, threads, offline, api_key)
    if json_out:
        typer.echo(json.dumps([{"id": h.id, "score": round(h.score, 6), "text": h.text} for h in hits], ensure_ascii=False))
        return
    con = out_console()
    for h in hits:
        con.print(f"{h.score:.4f}  {h.text}", soft_wrap=True, markup=False, highlight=False)


def nearest(index: Path, query: str, n: int, threads: int | None = None, offline: bool = False,
            api_key: str | None = None) -> list:
    """The `n` stored texts of an index nearest to `query`, embedded by the model (or server)
    that made the index (search, and tallow mcp serve's search tool)."""
    from tallow.cli.models import open_embedder
    from tallow.jobs.vector_index import VectorIndex
    from tallow.runtime.embedding.embed import Shaping

    vi = VectorIndex(index)
    try:
        meta = vi.meta
        pooling = meta.get("pooling")
        if api_key is not None and not meta.get("endpoint"):
            raise typer.BadParameter(f"{index} was made by a local model: it needs no key", param_hint="--api-key")
        if meta.get("endpoint"):
            local, embedder = _remote(o.endpoints([meta["endpoint"]], api_key, offline)[0], meta["model"])
        else:
            local, embedder = open_embedder(meta["model"], o.embed_settings(threads, "auto", pooling, 512), offline)
        try:
            if meta.get("model_sha256") and local.sha256 and local.sha256 != meta["model_sha256"]:
                raise TallowError(f"{meta['model']} is not the file that made {index} (its sha256 differs)",
                                  "rebuild the index with the model you have")
            dims = int(meta["dimensions"])
            toks = embedder.fit(embedder.tokens(query), 0, truncate=True)
            vec = next(embedder.vectors([toks], Shaping(normalize=True, dimensions=dims if dims < embedder.width else None)))
        finally:
            embedder.close()
        return vi.search(vec, n)
    finally:
        vi.close()


def tokenize(
    model: o.Model,
    text: Optional[str] = typer.Argument(None, help="The text [default: all of stdin].", show_default=False),
    count: bool = typer.Option(False, "--count", "-c", help="Print only how many tokens the text is."),
    no_bos: bool = typer.Option(False, "--no-bos", help="Leave out the BOS token the model puts before a prompt."),
    no_special: bool = typer.Option(False, "--no-special", help="Read special tokens written in the text (<|im_start|>) as plain text."),
    as_json: o.Json = False,
    offline: o.Offline = False,
) -> None:
    """Split a text into the model's tokens, or count them.

    The text is taken as it is, with no chat template around it (a request's whole prompt is
    counted by the server's /v1/chat/completions/input_tokens). Only the vocabulary is read,
    not the weights, so it is quick on any model.

    Example: tallow tokenize smollm2:135m --count < notes.txt
    """
    from tallow.cli.models import find_model
    from tallow.runtime.opening import open_vocabulary

    if text is None:
        if sys.stdin.isatty():
            raise typer.BadParameter("give a TEXT, or pipe one in", param_hint="TEXT")
        text = sys.stdin.read()
    if count and as_json:
        raise typer.BadParameter("--count prints a number; --json prints the tokens and their count", param_hint="--count")
    local = find_model(model, offline)
    vocab = open_vocabulary(local)
    try:
        ids = vocab.tokenize(text, add_special=not no_bos, parse_special=not no_special)
        pieces = [vocab.written(t).decode("utf-8", "replace") for t in ids]
    finally:
        vocab.close()
    if count:
        print(len(ids))
    elif as_json:
        print(json.dumps({"model": local.name, "count": len(ids), "tokens": [{"id": t, "piece": p} for t, p in zip(ids, pieces)]},
                         ensure_ascii=False))
    else:
        sys.stdout.write("".join(f"{t}\t{json.dumps(p, ensure_ascii=False)}\n" for t, p in zip(ids, pieces)))
