"""tallow bench: llama-bench's tests and field names, plus TTFT, memory and the bandwidth ceiling."""

from __future__ import annotations

import itertools
import json
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from tallow.cli import options as o
from tallow.cli.flag_groups import EndpointFlags, FlagGroup, with_groups
from tallow.cli.models import find_model
from tallow.cli.render import animated, emit_rows, err_console, human_bytes, human_count
from tallow.env import settings

FORMATS = ("table", "json", "jsonl", "csv", "md")
if TYPE_CHECKING:
    from tallow.runtime.types import LoadSettings

KEY = ("model_filename", "test", "n_threads", "n_batch", "n_gpu_layers", "type_k", "type_v", "flash_attn")


def _items(value: str) -> list[str]:
    """A comma-separated list's items, as llama-bench takes every parameter."""
    return [v.strip() for v in value.split(",") if v.strip()]


def _words(value: str, flag: str) -> list[str]:
    got = _items(value)
    if not got:
        raise typer.BadParameter("give one or more values, comma-separated", param_hint=flag)
    return got


def _ints(value: str, flag: str, minimum: int = 0, maximum: int = 10_000_000) -> list[int]:
    try:
        out = [int(v) for v in _items(value)]
    except ValueError:
        shown = value if len(value) <= 40 else value[:40] + "..."
        raise typer.BadParameter(f"{shown!r} is not a comma-separated list of whole numbers", param_hint=flag) from None
    if not out or min(out) < minimum or max(out) > maximum:
        raise typer.BadParameter(f"give one or more numbers from {minimum} to {maximum:,}", param_hint=flag)
    return out


def _layer_choices(value: str) -> list[str]:
    return [o.parse_gpu_layers(v) for v in _items(value)] or [o.parse_gpu_layers("")]


class LocalBench(FlagGroup):
    """llama-bench's settings, each a comma-separated list to run every combination of."""

    pg: Annotated[Optional[list[str]], typer.Option("-pg", help="pp+tg tests: PROMPT,GEN (repeatable).", show_default=False)] = None
    depth: Annotated[str, typer.Option("-d", "--n-depth", help="Context depths to run each test at.")] = "0"
    reps: Annotated[int, typer.Option("-r", "--repetitions", min=1, help="Repetitions of each test.")] = 5
    threads: Annotated[Optional[str], typer.Option("-t", "--threads", help="Thread counts [default: physical cores].", show_default=False)] = None
    batch: Annotated[str, typer.Option("-b", "--batch-size", help="Batch sizes.")] = "512"
    gpu_layers: Annotated[str, typer.Option("--gpu-layers", "-ngl", help="GPU layers, comma-separated: auto (what run uses), all, or a number.")] = "auto"
    device: o.Device = None
    main_gpu: o.MainGpu = 0
    split_mode: o.SplitMode = "layer"
    tensor_split: o.TensorSplit = None
    ctk: Annotated[str, typer.Option("--ctk", "--cache-type-k", help="K cache types.")] = "f16"
    ctv: Annotated[str, typer.Option("--ctv", "--cache-type-v", help="V cache types.")] = "f16"
    flash_attn: Annotated[str, typer.Option("--flash-attn", "-fa", help="Flash attention: auto, on or off (or 1, 0).")] = "auto"

    def kv_settings(self) -> list[tuple[str, str, str]]:
        """Every combination of the K and V cache types and flash attention asked for, each
        checked (a quantized V cache turns "auto" on), without repeats."""
        flash = [{"1": "on", "0": "off"}.get(v, v) for v in _words(self.flash_attn, "-fa")]
        combos = itertools.product(_words(self.ctk, "--ctk"), _words(self.ctv, "--ctv"), flash)
        return list(dict.fromkeys(o.cache_types(k, v, fa) for k, v, fa in combos))

    def given(self) -> dict[str, bool]:
        return {"-pg": bool(self.pg), "-d": self.depth != "0", "-r": self.reps != 5, "-t": self.threads is not None,
                "-b": self.batch != "512", "--gpu-layers": self.gpu_layers != "auto", "--device": self.device is not None,
                "--main-gpu": self.main_gpu != 0, "--split-mode": self.split_mode != "layer",
                "--tensor-split": self.tensor_split is not None, "--ctk": self.ctk != "f16", "--ctv": self.ctv != "f16",
                "-fa": self.flash_attn != "auto"}


class LoadTest(FlagGroup):
    """With --endpoint: the load a server is put under, and the SLO it is held to."""

    rate: Annotated[Optional[str], typer.Option("--rate", help="With --endpoint: Poisson arrival rates to load it at (requests/s, e.g. 0.5,1,2).", show_default=False)] = None
    num_requests: Annotated[int, typer.Option("--num-requests", min=1, max=100_000, help="With --endpoint: requests per load point.")] = 32
    max_seconds: Annotated[float, typer.Option("--max-seconds", callback=o.finite, min=1.0, help="With --endpoint: no new request after this long, per load point.")] = 120.0
    prompts: Annotated[Optional[Path], typer.Option("--prompts", help="With --endpoint: a JSONL file of real requests ({\"prompt\"} or {\"messages\"}) instead of synthetic ones.", show_default=False)] = None
    ttft_ms: Annotated[Optional[float], typer.Option("--ttft-ms", callback=o.finite, min=1.0, help="With --endpoint: an explicit SLO: TTFT limit in ms (with --tpot-ms).", show_default=False)] = None
    tpot_ms: Annotated[Optional[float], typer.Option("--tpot-ms", "--itl-ms", callback=o.finite, min=0.1, help="With --endpoint: an explicit SLO: ms per output token after the first.", show_default=False)] = None
    ignore_eos: Annotated[bool, typer.Option("--ignore-eos", help="With --endpoint: ask for exactly -n tokens (vLLM, llama.cpp and tallow serve take it).")] = False

    def given(self) -> dict[str, bool]:
        return {"--rate": self.rate is not None, "--num-requests": self.num_requests != 32,
                "--max-seconds": self.max_seconds != 120.0, "--prompts": self.prompts is not None,
                "--ttft-ms": self.ttft_ms is not None, "--tpot-ms": self.tpot_ms is not None,
                "--ignore-eos": self.ignore_eos}


class Report(FlagGroup):
    """Where the figures go: the format, a file to save them to, saved ones to compare with."""

    output: Annotated[str, typer.Option("-o", "--output", help="table, json, jsonl, csv or md.")] = "table"
    as_json: Annotated[bool, typer.Option("--json", help="Same as -o json.")] = False
    save: Annotated[Optional[Path], typer.Option("--save", help="Also write the results (JSON) to FILE.", show_default=False)] = None
    compare: Annotated[Optional[Path], typer.Option("--compare", help="Show the change against results saved with --save.", show_default=False)] = None
    plot: Annotated[Optional[str], typer.Option("--plot", help="Draw tok/s and TTFT against what the run varies: '-' in the terminal, or FILE.svg (the plot extra).", show_default=False)] = None

    def format(self) -> str:
        output = "json" if self.as_json else self.output
        if output not in FORMATS:
            raise typer.BadParameter(f"use one of {', '.join(FORMATS)}", param_hint="--output")
        return output


@with_groups(local=LocalBench, report=Report, server=EndpointFlags, load=LoadTest)
def bench(
    models: list[str] = typer.Argument(..., help="Models to measure.", show_default=False, autocompletion=o.complete_model),
    n_prompt: str = typer.Option("512", "-p", "--n-prompt", help="Prompt lengths for pp tests (0: none)."),
    n_gen: str = typer.Option("128", "-n", "--n-gen", help="Generation lengths for tg tests (0: none)."),
    parallel: Optional[str] = typer.Option(None, "--parallel", help="Also decode N sequences at once (aggregate tok/s), for each N.", show_default=False),
    slo: Optional[str] = typer.Option(None, "--slo", help="interactive or server: the most parallel sequences that still meet MLPerf's TTFT and per-token targets.", show_default=False),
    offline: o.Offline = False,
    *, local: LocalBench, report: Report, server: EndpointFlags, load: LoadTest,
) -> None:
    """Measure prefill and decode speed, like llama-bench.

    Also how close decode gets to the memory bandwidth limit, peak memory, and with
    --parallel the aggregate speed of several sequences at once. With --endpoint, a load
    test of that server: --parallel clients at once or --rate arrivals a second, and with
    --slo the goodput: the highest rate at which the SLO holds.

    \b
    Examples:
      tallow bench smollm2:135m -p 512 -n 128 -t 1,2 -o md
      tallow bench smollm2:135m --endpoint http://127.0.0.1:8080/v1 --parallel 1,4 --slo server
    """
    output = report.format()
    if report.plot is not None:
        from tallow.cli.screens.plots import check_target

        check_target(report.plot)
    kvs = local.kv_settings()
    from tallow.runtime.bench import SLO

    if slo is not None and slo not in SLO:
        raise typer.BadParameter("use interactive or server", param_hint="--slo")
    remote = server.servers(offline)
    if remote:
        o.refuse_local(local.given())
        rows = _remote(models, remote[0], n_prompt, n_gen, parallel, slo, load, output, report)
    else:
        for flag, used in load.given().items():
            if used:
                raise typer.BadParameter("this is for loading a server: give --endpoint", param_hint=flag)
        rows = _local_rows(models, n_prompt, n_gen, parallel, slo, local, kvs, offline, report)
        if report.save:
            report.save.write_text(json.dumps(rows, indent=1))
        _emit(rows, output)
        if slo:
            _slo_verdict(rows, slo, to_stderr=output != "table")
    if report.plot is not None:
        from tallow.cli.screens.plots import draw

        draw(rows, report.plot)


def _local_rows(models: list[str], n_prompt: str, n_gen: str, parallel: str | None, slo: str | None,
                local: LocalBench, kvs: list[tuple[str, str, str]], offline: bool, report: Report) -> list[dict]:
    """Every test of every combination, measured here (and the change against saved figures)."""
    from tallow.runtime.host.threads import physical_cores

    parallel_ns = _ints(parallel, "--parallel", 1) if parallel else ([1, 2, 4, 8, 16] if slo else [])
    tests = _tests(_ints(n_prompt, "-p"), _ints(n_gen, "-n"), local.pg or [], _ints(local.depth, "-d"))
    if not tests:
        raise typer.BadParameter("no tests: give -p, -n or -pg", param_hint="-p/-n/-pg")
    combos = list(itertools.product(_ints(local.threads, "-t", 1) if local.threads else [physical_cores()],
                                    _ints(local.batch, "-b", 1), _layer_choices(local.gpu_layers)))
    baseline = _load_saved(report.compare) if report.compare else None
    found = [find_model(m, offline=offline or settings.offline()) for m in models]
    place = o.placement(local.device, local.main_gpu, local.split_mode, local.tensor_split)
    rows = _measure(found, tests, combos, local.reps, kvs, place)
    if parallel_ns:
        p, n = (_ints(n_prompt, "-p")[0] or 128), (_ints(n_gen, "-n")[0] or 32)
        for kv in kvs:
            rows += _measure_parallel(found, parallel_ns, p, n, combos[0], min(local.reps, 3), *kv, place)
    if baseline is not None:
        for r in rows:
            old = baseline.get(tuple(r[k] for k in KEY))
            r["change_vs_saved"] = (r["avg_ts"] / old["avg_ts"] - 1) if old else None
    return rows


def _remote(models, endpoint, n_prompt, n_gen, parallel, slo, test: LoadTest, output: str,
            report: Report) -> list[dict]:
    from tallow.cli.bench_remote import bench_remote, read_prompts
    from tallow.client import loadgen
    from tallow.runtime.bench import SLO

    if len(models) != 1:
        raise typer.BadParameter("a load test is of one model: give its name on the server", param_hint="MODELS")
    rate, ttft_ms, tpot_ms = test.rate, test.ttft_ms, test.tpot_ms
    if (ttft_ms is None) != (tpot_ms is None):
        raise typer.BadParameter("an explicit SLO needs both --ttft-ms and --tpot-ms", param_hint="--ttft-ms")
    if slo is not None and ttft_ms is not None:
        raise typer.BadParameter("give --slo or --ttft-ms/--tpot-ms, not both", param_hint="--slo")
    explicit = loadgen.SLO(ttft_ms, tpot_ms) if ttft_ms is not None and tpot_ms is not None else None
    target = loadgen.SLO(*SLO[slo]) if slo else explicit
    rates = []
    if rate:
        try:
            rates = [float(v) for v in rate.split(",") if v.strip()]
        except ValueError:
            raise typer.BadParameter(f"{rate!r} is not a comma-separated list of rates", param_hint="--rate") from None
        if not rates or min(rates) <= 0 or max(rates) > 10_000:
            raise typer.BadParameter("give rates above 0, up to 10,000 requests/s", param_hint="--rate")
    concurrency = _ints(parallel, "--parallel", 1, 4096) if parallel else ([] if rates or target else [1, 2, 4, 8])
    load = loadgen.Load(models[0], _ints(n_prompt, "-p", 1)[0], _ints(n_gen, "-n", 1)[0], test.num_requests,
                        test.max_seconds, test.ignore_eos, read_prompts(test.prompts) if test.prompts else ())
    return bench_remote(endpoint, load, concurrency, rates, target, slo, output, report.save, report.compare)


def _measure_parallel(local, ns, n_prompt, n_gen, combo, reps, ctk, ctv, flash_attn, place) -> list[dict]:
    """Each N through the scheduler serve uses (a KV stream per slot, as serve loads it)."""
    import statistics
    from dataclasses import replace

    from tallow.models.gguf_file import read_gguf
    from tallow.runtime import bench as B
    from tallow.runtime.scheduling.scheduler import Scheduler
    from tallow.runtime.types import SchedulerSettings

    n_threads, n_batch, ngl = combo
    rows = []
    for model in local:
        params = sum(read_gguf(p).n_params for p in model.paths)
        for n in ns:
            load = replace(o.load_settings(n * (n_prompt + n_gen + 16), n_threads, str(ngl), flash_attn),
                           n_batch=max(n_batch, n), type_k=ctk, type_v=ctv, placement=place)
            sched = Scheduler.load(model.paths, load, SchedulerSettings(parallel=n, max_queue=n))
            try:
                res = B.run_parallel(sched, n_prompt, n_gen, reps)
                flash, offloaded = sched.engine.flash_attn, sched.engine.offloaded_layers
            finally:
                sched.close()
            samples = res.samples_ts
            rows.append({
                "model_filename": str(model.path), "model_name": model.name,
                "model_size": sum(p.stat().st_size for p in model.paths), "model_n_params": params,
                "n_batch": load.n_batch, "n_ubatch": load.n_batch, "n_threads": n_threads, "n_gpu_layers": offloaded,
                "type_k": ctk, "type_v": ctv, "flash_attn": flash, "n_prompt": n_prompt, "n_gen": n_gen,
                "n_depth": 0, "n_parallel": n, "test": f"pp{n_prompt}+tg{n_gen} x{n}",
                "test_time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "avg_ts": statistics.mean(samples), "stddev_ts": statistics.stdev(samples) if len(samples) > 1 else 0.0,
                "avg_ns": int(statistics.mean(res.decode_s) * 1e9),
                "stddev_ns": int(statistics.stdev(res.decode_s) * 1e9) if len(samples) > 1 else 0, "samples_ts": samples,
                "samples_ns": [round(s * 1e9) for s in res.decode_s], "decode_tokens": res.decode_tokens,
                "ttft_ms": res.ttft_p50, "itl_ms": res.itl_p50,
                "peak_memory_bytes": B.rss_bytes(), "bandwidth_bytes_per_s": None, "bytes_per_token": None,
                "bandwidth_fraction": None, "joules_per_token": None,
            })
    return rows


def _slo_verdict(rows: list[dict], slo: str, to_stderr: bool) -> None:
    from tallow.runtime.bench import SLO

    ttft_max, itl_max = SLO[slo]
    ok = [r for r in rows if r.get("n_parallel") and r["ttft_ms"] <= ttft_max and r["itl_ms"] <= itl_max]
    if ok:
        best = max(ok, key=lambda r: r["n_parallel"])
        line = (f"{slo} SLO (TTFT <= {ttft_max:.0f} ms, <= {itl_max:.0f} ms per token): up to {best['n_parallel']} "
                f"parallel sequences, {best['avg_ts']:.1f} tok/s in all")
    else:
        line = f"{slo} SLO (TTFT <= {ttft_max:.0f} ms, <= {itl_max:.0f} ms per token): not met even by one sequence"
    (sys.stderr if to_stderr else sys.stdout).write(line + "\n")


def _tests(prompts, gens, pgs, depths):
    from tallow.runtime.bench import BenchTest

    tests = [BenchTest(p, 0, d) for d in depths for p in prompts if p]
    tests += [BenchTest(0, n, d) for d in depths for n in gens if n]
    for spec in pgs:
        p, n = _ints(spec, "-pg", 1) + [0] * (2 - len(_ints(spec, "-pg", 1)))
        if not n:
            raise typer.BadParameter("-pg takes PROMPT,GEN", param_hint="-pg")
        tests += [BenchTest(p, n, d) for d in depths]
    return tests


def _load_saved(path: Path) -> dict:
    try:
        rows = json.loads(path.read_text())
        return {tuple(r[k] for k in KEY): r for r in rows}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        from tallow.common.errors import TallowError

        raise TallowError(f"cannot read saved results {path}: {exc}", "write them with tallow bench ... --save FILE") from exc


def _measure(local, tests, combos, reps, kvs: list[tuple[str, str, str]], place) -> list[dict]:
    from dataclasses import replace

    from tallow.models.gguf_file import read_gguf
    from tallow.runtime import bench as B
    from tallow.runtime.engine import Engine

    err = err_console()
    err.print("measuring memory bandwidth ...", style="dim")
    bandwidth = B.memory_bandwidth()
    if not B.energy_available():
        err.print("energy: not measured (no RAPL counters readable on this machine)", style="dim", soft_wrap=True)
    n_ctx = max(t.n_depth + t.n_prompt + t.n_gen for t in tests) + 8
    rows = []
    for model in local:
        info = read_gguf(model.path)
        for (n_threads, n_batch, ngl), (ctk, ctv, flash_attn) in itertools.product(combos, kvs):
            load = replace(o.load_settings(n_ctx, n_threads, str(ngl), flash_attn), n_batch=n_batch, type_k=ctk, type_v=ctv,
                           placement=place)
            done: list[tuple[int, dict]] = []
            for group_load, group in flash_attn_groups(load, model.paths, tests):
                with Engine(model.paths, group_load) as engine:
                    for index, test in group:
                        res = _timed(err, engine, test, reps, f"{test.name}  t={n_threads} b={n_batch}")
                        done.append((index, _row(model, info, engine, load, test, B.summarize(res), bandwidth)))
            rows += [row for _, row in sorted(done, key=lambda r: r[0])]
    return rows


def _timed(err, engine, test, reps: int, label: str):
    from tallow.runtime import bench as B

    status = err.status(label) if animated(err) else None
    if status:
        status.start()
    try:
        return B.run_test(engine, test, reps, _rep_counter(status, test.name, reps))
    finally:
        if status:
            status.stop()


def _row(model, info, engine, load, test, s: dict, bandwidth: float) -> dict:
    from tallow.runtime import bench as B

    row = {
        "model_filename": str(model.path), "model_name": model.name, "model_size": sum(p.stat().st_size for p in model.paths),
        "model_n_params": info.n_params, "model_type": f"{info.architecture} {info.file_type}",
        "n_batch": load.n_batch, "n_ubatch": load.n_batch, "n_threads": load.n_threads,
        "n_gpu_layers": engine.offloaded_layers, "type_k": load.type_k, "type_v": load.type_v,
        "flash_attn": engine.flash_attn, "n_prompt": test.n_prompt, "n_gen": test.n_gen, "n_depth": test.n_depth,
        "test": test.name, "test_time": datetime.now(timezone.utc).isoformat(timespec="seconds"), **s,
        "bandwidth_bytes_per_s": bandwidth, "bytes_per_token": None, "bandwidth_fraction": None,
    }
    if test.n_gen and not test.n_prompt:
        per_token = B.bytes_per_token(info, test.n_depth + test.n_gen // 2, load.type_k, load.type_v)
        row["bytes_per_token"] = per_token
        row["bandwidth_fraction"] = s["avg_ts"] * per_token / bandwidth
    return row


def flash_attn_groups(load: LoadSettings, paths, tests) -> list[tuple[LoadSettings, list]]:
    """The tests, numbered, grouped by the flash attention that "auto" chooses for each test's
    own work (prefill and decode can want it differently: on this kind of AMD CPU prefill ran
    3x faster with it and decode 1.35x slower); one group when the flag names it."""
    from dataclasses import replace

    from tallow.runtime.backend import supports_gpu_offload
    from tallow.runtime.calibration.machine import Workload
    from tallow.runtime.loadplan import choose_flash_attn, read_shape

    numbered = list(enumerate(tests))
    if load.flash_attn != "auto":
        return [(load, numbered)]
    shape, offload = read_shape(list(paths)), supports_gpu_offload()
    groups: dict[str, list] = {}
    for index, test in numbered:
        work = Workload(test.n_depth + test.n_prompt, test.n_gen)
        groups.setdefault(choose_flash_attn(replace(load, workload=work), shape, offload), []).append((index, test))
    return [(replace(load, flash_attn=choice), group) for choice, group in groups.items()]


def _emit(rows: list[dict], output: str) -> None:
    emit_rows(rows, output, _table)


def _table(rows: list[dict], markdown: bool) -> None:
    head = ["model", "size", "params", "threads", "batch", "ngl", "fa", "test", "t/s", "TTFT ms", "ITL ms", "peak RSS",
            "of bandwidth limit"]
    if any("change_vs_saved" in r for r in rows):
        head.append("vs saved")
    lines = []
    for r in rows:
        cells = [r["model_name"], human_bytes(r["model_size"]), human_count(r["model_n_params"] or 0), str(r["n_threads"]),
                 str(r["n_batch"]), str(r["n_gpu_layers"]), r["flash_attn"], r["test"],
                 f"{r['avg_ts']:.2f} ± {r['stddev_ts']:.2f}", f"{r['ttft_ms']:.1f}" if r["ttft_ms"] else "-",
                 f"{r['itl_ms']:.1f}" if r.get("itl_ms") else "-",
                 human_bytes(r["peak_memory_bytes"]),
                 f"{r['bandwidth_fraction']:.0%}" if r["bandwidth_fraction"] is not None else "-"]
        if len(head) > len(cells):
            ch = r.get("change_vs_saved")
            cells.append(f"{ch:+.1%}" if ch is not None else "new")
        lines.append(cells)
    widths = [max(len(h), *(len(c[i]) for c in lines)) for i, h in enumerate(head)]
    if markdown:
        sys.stdout.write("| " + " | ".join(h.ljust(w) for h, w in zip(head, widths)) + " |\n")
        sys.stdout.write("| " + " | ".join("-" * w for w in widths) + " |\n")
        for c in lines:
            sys.stdout.write("| " + " | ".join(x.ljust(w) for x, w in zip(c, widths)) + " |\n")
        return
    sys.stdout.write("  ".join(h.ljust(w) for h, w in zip(head, widths)).rstrip() + "\n")
    for c in lines:
        sys.stdout.write("  ".join(x.ljust(w) for x, w in zip(c, widths)).rstrip() + "\n")
    bw = rows[0]["bandwidth_bytes_per_s"]
    sys.stdout.write(f"memory bandwidth (streaming read): {bw / 1e9:.1f} GB/s; 'of bandwidth limit' = decode tok/s x "
                     "bytes read per token (weights + KV cache) / bandwidth\n")


def _rep_counter(status, name: str, reps: int):
    """What run_test calls at each repetition: the spinner's line says which (None: no spinner)."""
    if status is None:
        return None

    def on_rep(rep: int) -> None:
        status.update(f"{name}  rep {rep}/{reps}")

    return on_rep
