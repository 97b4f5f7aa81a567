"""tallow batch: a JSONL file of requests decoded together, results to a JSONL file, resumable."""

from __future__ import annotations

import contextlib
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable, Iterator, Optional

import typer

from tallow.cli import options as o
from tallow.cli import presets
from tallow.cli.models import open_scheduler
from tallow.cli.render import animated, err_console
from tallow.common.errors import TallowError
from tallow.env import settings


@presets.with_preset
def batch(
    input: Path = typer.Argument(..., help="Requests, one JSON object per line: {\"id\", \"messages\"} or {\"id\", \"prompt\"}, with optional settings.", show_default=False),
    output: Path = typer.Option(..., "--output", "-o", help="Results, one JSON object per line; appended to, and ids already there are skipped.", show_default=False),
    model: str = typer.Option("smollm2:135m", "--model", "-m", help="The model (a stored name, a known name, or a .gguf path).", autocompletion=o.complete_model),
    parallel: o.Parallel = 8,
    max_tokens: int = typer.Option(4096, "--max-tokens", min=1, help="Default and clamp for each request's max_tokens."),
    deterministic: o.Deterministic = False,
    kv_unified: o.KvUnified = False,
    ctx: o.Ctx = None,
    threads: o.Threads = None,
    gpu_layers: o.GpuLayers = "auto",
    flash_attn: o.FlashAttn = "auto",
    cache_type_k: o.CacheTypeK = "f16",
    cache_type_v: o.CacheTypeV = "f16",
    draft: o.Draft = None,
    draft_max: o.DraftMax = 16,
    draft_min: o.DraftMin = 0,
    draft_p_min: o.DraftPMin = 0.75,
    mmproj: o.Mmproj = None,
    lora: o.Lora = None,
    tool_format: o.ToolFormat = "auto",
    no_cache: o.NoCache = False,
    retry_failed: bool = typer.Option(False, "--retry-failed", help="Take the error records out of the output and run those requests again."),
    offline: o.Offline = False,
    endpoint: o.Endpoint = None,
    api_key: o.EndpointKey = None,
    retries: int = typer.Option(6, "--retries", min=0, max=100, help="With --endpoint: attempts after the first for a request that met a 429, a 5xx or a lost connection."),
    affinity_chars: int = typer.Option(512, "--affinity-chars", min=0, help="With several --endpoint or --ray: requests whose prompts share their first N characters go to the same server or actor (0: off)."),
    ray: Optional[str] = typer.Option(None, "--ray", help="Answer on a Ray cluster: local (one started for the job), auto, or the head's address (ray://HOST:10001, HOST:6379). Needs tallow[ray].", show_default=False),
    ray_actors: int = typer.Option(0, "--ray-actors", min=0, help="With --ray: engines to start, one Ray actor each (0: as many as the cluster's CPUs hold)."),
    ray_cpus_per_actor: int = typer.Option(1, "--ray-cpus-per-actor", min=1, help="With --ray: CPUs each actor reserves; its engine's threads."),
    ray_weights: str = typer.Option("auto", "--ray-weights", help="With --ray: how nodes get the weights: path (the same file at the same path on every node), ship (through Ray's object store), auto (path, else shipped when up to 1 GiB)."),
) -> None:
    """Run every request of a JSONL file, many at once.

    Each result line has the id, text, finish reason, usage and timings; a bad line gets an
    error record and the batch goes on. Running again skips ids already in the output;
    requests that failed stay failed (exit 1) until --retry-failed runs them again.

    With --endpoint (repeatable), the requests go to those servers instead, --parallel at a
    time to each, retried when a server fails, each line's body sent as it is. With --ray,
    they go to Ray actors on a cluster, each a tallow engine; an actor lost with its node is
    replaced and its requests run again elsewhere.

    \b
    Examples:
      tallow batch questions.jsonl -o answers.jsonl --parallel 8
      tallow batch questions.jsonl -o answers.jsonl --endpoint http://a:8080/v1 --endpoint http://b:8080/v1
      tallow batch questions.jsonl -o answers.jsonl --ray auto --ray-cpus-per-actor 4
    """
    from tallow.jobs.batch import run_batch
    from tallow.jobs.records import BatchStats, count_requests, open_output, previous_results, read_lines
    from tallow.runtime.types import SchedulerSettings
    from tallow.wire.request import Limits

    remote = o.endpoints(endpoint, api_key, offline, many=True)
    ray_opts = _ray_options(ray, ray_actors, ray_cpus_per_actor, ray_weights, bool(remote), threads, offline)
    if remote:
        o.refuse_local({"--deterministic": deterministic, "--kv-unified": kv_unified, "--ctx": ctx is not None,
                        "--threads": threads is not None, "--gpu-layers": gpu_layers != "auto",
                        "--flash-attn": flash_attn != "auto", "--cache-type-k": cache_type_k != "f16",
                        "--cache-type-v": cache_type_v != "f16", "--draft": draft is not None, "--draft-max": o.draft_limits_given(draft_max, draft_min, draft_p_min),
                        "--tool-format": tool_format != "auto", "--no-cache": no_cache, "--mmproj": mmproj is not None,
                        "--lora": bool(lora)})
    for flag, used in (("--retries", retries != 6), ("--affinity-chars", affinity_chars != 512)):
        if used and not remote and ray_opts is None:
            raise typer.BadParameter("this spreads requests over servers or actors: give --endpoint or --ray",
                                     param_hint=flag)
    else:
        cache_type_k, cache_type_v, flash_attn = o.cache_types(cache_type_k, cache_type_v, flash_attn)
    forced_format = o.parse_tool_format(tool_format)
    if not input.is_file():
        raise typer.BadParameter(f"{input} is not a readable file", param_hint="INPUT")
    if output.exists() and (output.is_dir() or output.resolve() == input.resolve()):
        raise typer.BadParameter("the output must be a file other than the input", param_hint="--output")
    try:
        total = count_requests(input)
        previous = previous_results(output, retry_failed)
        out = open_output(output)
    except OSError as exc:
        raise TallowError(f"cannot use {exc.filename}: {exc.strerror}") from exc
    if remote:
        with out:
            stats = _remote(remote, model, parallel, max_tokens, retries, affinity_chars, input, out, previous, total)
        _report(stats, input, output)
        return
    load = o.load_settings(ctx, threads, gpu_layers, flash_attn, cache_type_k, cache_type_v)
    load = replace(o.with_draft(load, draft), mmproj=o.checked_mmproj(mmproj), loras=o.loras(lora))
    load = o.draft_model(load, draft, offline, draft_max, draft_min, draft_p_min, target=model)
    sched_settings = SchedulerSettings(parallel=parallel, deterministic=deterministic, kv_unified=kv_unified,
                                       max_queue=parallel * 4, max_tokens_cap=max_tokens, draft=o.parse_draft(draft))
    if ray_opts is not None:
        with out:
            stats = _on_ray(ray_opts, model, load, sched_settings, forced_format, offline, parallel, max_tokens, retries,
                            affinity_chars, input, out, previous, total)
        _report(stats, input, output)
        return
    with out:
        name, sched = open_scheduler(model, load, offline, sched_settings, disk_cache=not no_cache)
        try:
            stats = BatchStats(total=total)
            with _progress(total) as show:
                limits = Limits(max_tokens=max_tokens, model=name, n_vocab=sched.engine.model.n_vocab,
                                tool_format=forced_format or sched.engine.tool_format(),
                                sampling=presets.sampling_base(), stop=presets.stops(),
                                n_adapters=len(sched.engine.adapters.specs))
                run_batch(sched, read_lines(input), out, limits, previous, stats, show)
        finally:
            sched.close()
    _report(stats, input, output)


def _remote(endpoints, model: str, parallel: int, max_tokens: int, retries: int, affinity_chars: int, input: Path,
            out, previous, total: int):
    from tallow.jobs.fleet import Fleet, FleetSettings, FleetStats, HttpTarget
    from tallow.jobs.records import read_lines

    fleet = Fleet([HttpTarget(e) for e in endpoints], FleetSettings(concurrency=parallel, retries=retries, affinity_chars=affinity_chars,
                                           max_tokens=max_tokens), model)
    stats = FleetStats(total=total)
    with _progress(total) as show:
        fleet.run(read_lines(input), out, previous, stats, show)
    return stats


def _ray_options(address: str | None, actors: int, cpus: int, weights: str, remote: bool, threads: int | None,
                 offline: bool):
    """--ray's settings checked, or None without --ray (its other flags are then refused)."""
    from tallow.cli.ray.connect import checked_options

    opts = checked_options(address, actors, cpus, weights, offline or settings.offline(),
                           ("--ray-actors", "--ray-cpus-per-actor"), "actors of a batch")
    if opts is not None and remote:
        raise typer.BadParameter("give --ray or --endpoint, not both", param_hint="--ray")
    if opts is not None and threads is not None:
        raise typer.BadParameter("with --ray each engine's threads are --ray-cpus-per-actor", param_hint="--threads")
    return opts


def _on_ray(opts, model: str, load, sched, forced_format, offline: bool, parallel: int, max_tokens: int,
            retries: int, affinity_chars: int, input: Path, out, previous, total: int):
    from tallow.cli.models import find_model
    from tallow.cli.ray.batch import run_on_ray
    from tallow.jobs.fleet import FleetSettings
    from tallow.wire.request import Limits

    local = find_model(model, offline)
    limits = Limits(max_tokens=max_tokens, model=local.name, sampling=presets.sampling_base(), stop=presets.stops())
    fleet = FleetSettings(concurrency=parallel, retries=retries, affinity_chars=affinity_chars,
                          max_tokens=max_tokens, n_allowed=True)
    stats, pool = run_on_ray(opts, local, load, sched, limits, forced_format, fleet, input, out, previous, total,
                             _progress)
    console = err_console()
    nodes = ", ".join(f"{n}: {k}" for n, k in sorted(pool.nodes.items()))
    shipped = sorted(f for f, how in pool.weights.items() if how == "shipped")
    causes = f" ({', '.join(pool.causes)})" if pool.causes else ""
    console.print(f"ray: actors loaded on {nodes or 'no node'}; {pool.replaced} replaced{causes}"
                  + (f"; shipped {', '.join(shipped)}" if shipped else ""), soft_wrap=True, markup=False)
    return stats


def _report(stats, input: Path, output: Path) -> None:
    console = err_console()
    earlier = f"{stats.skipped} already in {output}" + (f", {stats.failed_before} failed earlier" if stats.failed_before else "")
    console.print(f"{stats.done} done, {stats.failed} failed, {earlier}; "
                  f"{stats.completion_tokens} tokens at {stats.tokens_per_s:.1f} tok/s", soft_wrap=True)
    members = getattr(stats, "members", None)
    if members:  # with --endpoint: each server's share, and what its prompt cache served
        if stats.done:  # (nothing answered this run: nothing to say about the caches)
            console.print(stats.cache_line(), soft_wrap=True)
        for m in members:
            state = " (out of service now)" if m.down_until > time.monotonic() else ""
            console.print(f"  {m.target.name}: {m.done} answered, {m.retried} failed and retried{state}",
                          soft_wrap=True, markup=False)
    failed = stats.failed + stats.failed_before
    if failed:
        raise TallowError(f"{failed} request(s) failed; their error records are in {output}",
                          f"fix those lines, then run them again: tallow batch {input} -o {output} --retry-failed")


@contextlib.contextmanager
def _progress(total: int) -> Iterator[Callable]:
    """Requests done of all, tokens/s and ETA on a terminal; nothing otherwise."""
    console = err_console()
    if not animated(console):
        yield lambda stats: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    columns = (TextColumn("batch"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[rate]}"),
               TimeRemainingColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("batch", total=total, rate="")

        def show(stats) -> None:
            progress.update(task, completed=stats.done + stats.failed + stats.skipped,
                            rate=f"{stats.tokens_per_s:.1f} tok/s")

        yield show
