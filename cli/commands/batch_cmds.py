"""tallow batch: a JSONL file of requests decoded together, results to a JSONL file, resumable."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Annotated, Callable, Iterator, NamedTuple, Optional

import typer

from tallow.cli import options as o
from tallow.cli import presets
from tallow.cli.flag_groups import DraftFlags, EndpointFlags, FlagGroup, LoadFlags, ModelFiles, with_groups
from tallow.cli.models import open_scheduler
from tallow.cli.render import animated, err_console
from tallow.common.errors import TallowError
from tallow.env import settings


class FleetFlags(FlagGroup):
    """Several servers (--endpoint, repeatable) or Ray actors: retries and prefix affinity."""

    retries: Annotated[int, typer.Option("--retries", min=0, max=100, help="With --endpoint: attempts after the first for a request that met a 429, a 5xx or a lost connection.")] = 6
    affinity_chars: Annotated[int, typer.Option("--affinity-chars", min=0, help="With several --endpoint or --ray: requests whose prompts share their first N characters go to the same server or actor (0: off).")] = 512

    def given(self) -> dict[str, bool]:
        return {"--retries": self.retries != 6, "--affinity-chars": self.affinity_chars != 512}


class BatchRayFlags(FlagGroup):
    """--ray: the batch answered by Ray actors, each a tallow engine."""

    ray: Annotated[Optional[str], typer.Option("--ray", help="Answer on a Ray cluster: local (one started for the job), auto, or the head's address (ray://HOST:10001, HOST:6379). Needs tallow[ray].", show_default=False)] = None
    ray_actors: Annotated[int, typer.Option("--ray-actors", min=0, help="With --ray: engines to start, one Ray actor each (0: as many as the cluster's CPUs hold).")] = 0
    ray_cpus_per_actor: Annotated[int, typer.Option("--ray-cpus-per-actor", min=1, help="With --ray: CPUs each actor reserves; its engine's threads.")] = 1
    ray_weights: Annotated[str, typer.Option("--ray-weights", help="With --ray: how nodes get the weights: path (the same file at the same path on every node), ship (through Ray's object store), auto (path, else shipped when up to 1 GiB).")] = "auto"


class Job(NamedTuple):
    """A batch's settings once checked."""

    model: str
    parallel: int
    max_tokens: int
    offline: bool
    forced_format: str | None
    fleet: FleetFlags


@presets.with_preset
@with_groups(load=LoadFlags, files=ModelFiles, drafting=DraftFlags, server=EndpointFlags, fleet=FleetFlags,
             on_ray=BatchRayFlags)
def batch(
    input: Path = typer.Argument(..., help="Requests, one JSON object per line: {\"id\", \"messages\"} or {\"id\", \"prompt\"}, with optional settings.", show_default=False),
    output: Path = typer.Option(..., "--output", "-o", help="Results, one JSON object per line; appended to, and ids already there are skipped.", show_default=False),
    model: str = typer.Option("smollm2:135m", "--model", "-m", help="The model (a stored name, a known name, or a .gguf path).", autocompletion=o.complete_model),
    parallel: o.Parallel = 8,
    max_tokens: int = typer.Option(4096, "--max-tokens", min=1, help="Default and clamp for each request's max_tokens."),
    deterministic: o.Deterministic = False,
    kv_unified: o.KvUnified = False,
    tool_format: o.ToolFormat = "auto",
    no_cache: o.NoCache = False,
    retry_failed: bool = typer.Option(False, "--retry-failed", help="Take the error records out of the output and run those requests again."),
    offline: o.Offline = False,
    *, load: LoadFlags, files: ModelFiles, drafting: DraftFlags, server: EndpointFlags, fleet: FleetFlags,
    on_ray: BatchRayFlags,
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
    from tallow.runtime.types import SchedulerSettings

    remote = server.servers(offline, many=True)
    ray_opts = _ray_options(on_ray, bool(remote), load.threads, offline)
    if remote:
        o.refuse_local({"--deterministic": deterministic, "--kv-unified": kv_unified, **load.given(), **files.given(),
                        **drafting.given(), "--tool-format": tool_format != "auto", "--no-cache": no_cache})
    elif ray_opts is None:
        for flag, used in fleet.given().items():
            if used:
                raise typer.BadParameter("this spreads requests over servers or actors: give --endpoint or --ray",
                                         param_hint=flag)
    job = Job(model, parallel, max_tokens, offline, o.parse_tool_format(tool_format), fleet)
    checked = None if remote else load.settings(files)  # refused before the output is opened
    out, previous, total = _opened(input, output, retry_failed)
    with out:
        if remote:
            stats = _remote(remote, job, input, out, previous, total)
        else:
            local = drafting.loaded(o.with_draft(checked, drafting.draft), offline, model)
            sched = SchedulerSettings(parallel=parallel, deterministic=deterministic, kv_unified=kv_unified,
                                      max_queue=parallel * 4, max_tokens_cap=max_tokens, draft=drafting.method())
            stats = _on_ray(ray_opts, job, local, sched, input, out, previous, total) if ray_opts is not None else \
                _local(job, local, sched, not no_cache, input, out, previous, total)
    _report(stats, input, output)


def _opened(input: Path, output: Path, retry_failed: bool):
    """(the output, opened to append; the results already there; the requests in the input)."""
    from tallow.jobs.records import count_requests, open_output, previous_results

    if not input.is_file():
        raise typer.BadParameter(f"{input} is not a readable file", param_hint="INPUT")
    if output.exists() and (output.is_dir() or output.resolve() == input.resolve()):
        raise typer.BadParameter("the output must be a file other than the input", param_hint="--output")
    try:
        total = count_requests(input)
        previous = previous_results(output, retry_failed)
        return open_output(output), previous, total
    except OSError as exc:
        raise TallowError(f"cannot use {exc.filename}: {exc.strerror}") from exc


def _local(job: Job, load, sched_settings, disk_cache: bool, input: Path, out, previous, total: int):
    """The batch through this machine's scheduler."""
    from tallow.jobs.batch import run_batch
    from tallow.jobs.records import BatchStats, read_lines
    from tallow.wire.request import Limits

    name, sched = open_scheduler(job.model, load, job.offline, sched_settings, disk_cache=disk_cache)
    try:
        stats = BatchStats(total=total)
        with _progress(total) as show:
            limits = Limits(max_tokens=job.max_tokens, model=name, n_vocab=sched.engine.model.n_vocab,
                            tool_format=job.forced_format or sched.engine.tool_format(),
                            sampling=presets.sampling_base(), stop=presets.stops(),
                            n_adapters=len(sched.engine.adapters.specs))
            run_batch(sched, read_lines(input), out, limits, previous, stats, show)
        return stats
    finally:
        sched.close()


def _remote(endpoints, job: Job, input: Path, out, previous, total: int):
    from tallow.jobs.fleet import Fleet, FleetSettings, FleetStats, HttpTarget
    from tallow.jobs.records import read_lines

    settings_ = FleetSettings(concurrency=job.parallel, retries=job.fleet.retries,
                              affinity_chars=job.fleet.affinity_chars, max_tokens=job.max_tokens)
    fleet = Fleet([HttpTarget(e) for e in endpoints], settings_, job.model)
    stats = FleetStats(total=total)
    with _progress(total) as show:
        fleet.run(read_lines(input), out, previous, stats, show)
    return stats


def _ray_options(on_ray: BatchRayFlags, remote: bool, threads: int | None, offline: bool):
    """--ray's settings checked, or None without --ray (its other flags are then refused)."""
    from tallow.cli.ray.connect import checked_options

    opts = checked_options(on_ray.ray, on_ray.ray_actors, on_ray.ray_cpus_per_actor, on_ray.ray_weights,
                           offline or settings.offline(),
                           ("--ray-actors", "--ray-cpus-per-actor"), "actors of a batch")
    if opts is not None and remote:
        raise typer.BadParameter("give --ray or --endpoint, not both", param_hint="--ray")
    if opts is not None and threads is not None:
        raise typer.BadParameter("with --ray each engine's threads are --ray-cpus-per-actor", param_hint="--threads")
    return opts


def _on_ray(opts, job: Job, load, sched, input: Path, out, previous, total: int):
    from tallow.cli.models import find_model
    from tallow.cli.ray.batch import run_on_ray
    from tallow.jobs.fleet import FleetSettings
    from tallow.wire.request import Limits

    local = find_model(job.model, job.offline)
    limits = Limits(max_tokens=job.max_tokens, model=local.name, sampling=presets.sampling_base(), stop=presets.stops())
    fleet = FleetSettings(concurrency=job.parallel, retries=job.fleet.retries, affinity_chars=job.fleet.affinity_chars,
                          max_tokens=job.max_tokens, n_allowed=True)
    stats, pool = run_on_ray(opts, local, load, sched, limits, job.forced_format, fleet, input, out, previous, total,
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
            if stats.affinity_line():
                console.print(stats.affinity_line(), soft_wrap=True)
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
