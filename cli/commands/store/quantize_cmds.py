"""tallow quantize and tallow eval: make smaller models, and measure what that cost."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Optional

import typer

from tallow.cli import options as o
from tallow.cli.models import find_model, store
from tallow.cli.render import animated, err_console, human_bytes


def _complete_type(incomplete: str) -> list[str]:
    from tallow.cli.completion import quant_types

    return quant_types(incomplete)


def _default_name(source_name: str, type_name: str) -> str:
    repo, _, tag = source_name.partition(":")
    if source_name.endswith(".gguf") or "/" in source_name and Path(source_name).exists():
        from tallow.cli.commands.store.import_cmds import default_name

        return f"{default_name(Path(source_name))}:{type_name}"
    return f"{repo}:{tag}-{type_name}" if tag and tag != "latest" else f"{repo}:{type_name}"


def quantize(
    model: Optional[str] = typer.Argument(None, help="The source: a stored model or a .gguf file (F32, F16 or BF16).", show_default=False, autocompletion=o.complete_model),
    type_: Optional[str] = typer.Option(None, "--type", help="The quantization type (see --list).", show_default=False, autocompletion=_complete_type),
    name: Optional[str] = typer.Option(None, "--name", help="The new model's name [default: the source's, with the type].", show_default=False),
    imatrix: Optional[Path] = typer.Option(None, "--imatrix", help="An importance matrix file (tallow imatrix).", show_default=False),
    allow_requantize: bool = typer.Option(False, "--allow-requantize", help="Allow an already quantized source (costs quality)."),
    leave_output_tensor: bool = typer.Option(False, "--leave-output-tensor", help="Keep output.weight unquantized."),
    pure: bool = typer.Option(False, "--pure", help="Every tensor in the chosen type (no mix)."),
    output_tensor_type: Optional[str] = typer.Option(None, "--output-tensor-type", help="The type of output.weight.", show_default=False),
    token_embedding_type: Optional[str] = typer.Option(None, "--token-embedding-type", help="The type of token_embd.weight.", show_default=False),
    threads: o.Threads = None,
    list_types: bool = typer.Option(False, "--list", help="List every type with its bits per weight (with MODEL: the size each would give it), and exit."),
    report: bool = typer.Option(False, "--report", help="Then measure the result against the source (the trade-off table)."),
    offline: o.Offline = False,
) -> None:
    """Quantize a model into a new stored model.

    It runs in a child process; nothing is kept on failure.

    Example: tallow quantize ./model-f16.gguf --type Q4_K_M --name mymodel:q4
    """
    if list_types:
        _list_types(find_model(model, offline=offline) if model else None)
        return
    if model is None or type_ is None:
        raise typer.BadParameter("give a MODEL and --type (or --list)", param_hint="MODEL/--type")
    from tallow.quantize.run import QuantizeOptions, quantize_model
    from tallow.quantize.types import quant_type

    qt = quant_type(type_)
    source = find_model(model, offline=offline)
    opts = QuantizeOptions(qt.name, name or _default_name(model if model.endswith(".gguf") else source.name, qt.name),
                           imatrix, allow_requantize, leave_output_tensor, pure, output_tensor_type,
                           token_embedding_type, threads or 0)
    before = sum(p.stat().st_size for p in source.paths)
    manifest = _with_progress(lambda progress: quantize_model(source, store(), opts, progress), f"{qt.name}")
    params = manifest.gguf.get("parameters") or 0
    bpw = manifest.size * 8 / params if params else 0
    err_console().print(f"stored {manifest.name}: {human_bytes(before)} -> {human_bytes(manifest.size)} "
                        f"({bpw:.2f} bits per weight)", soft_wrap=True)
    if report:
        from tallow.quantize.compare import compare_models

        result = find_model(manifest.name, offline=True)
        results = _with_eval_progress(lambda progress: compare_models(
            [source, result], o.load_settings(512, threads, "auto", "auto"), None, 512, None, True, True, progress))
        _print_results(results, as_json=False, table=True)


def _list_types(source) -> None:
    """Every type: its block format's bits, a whole file's bits per weight (llama.cpp's figures
    for an 8B model), and with a model, the size and bits each type would give that model."""
    from tallow.quantize.types import TYPES

    sizes = {}
    if source is not None:
        from tallow.quantize.run import type_sizes

        sizes = type_sizes(source)
        sys.stdout.write(f"{'TYPE':<8} {'SIZE':>9} {'BPW':>5}  {'BLOCK':>5}  ABOUT  ({source.name})\n")
    else:
        sys.stdout.write(f"{'TYPE':<8} {'BPW 8B':>6}  {'BLOCK':>5}  ABOUT\n")
    for t in TYPES:
        flag = " (needs --imatrix)" if t.needs_imatrix and "needs an imatrix" not in t.note else ""
        if source is None:
            sys.stdout.write(f"{t.name:<8} {t.typical_bpw:6.2f}  {t.block_bits:5.2f}  {t.note}{flag}\n")
            continue
        size, bpw = sizes.get(t.name, (None, None))
        shown = (f"{human_bytes(size):>9} {bpw:5.2f}" if size and bpw else f"{'-':>9} {'-':>5}")
        sys.stdout.write(f"{t.name:<8} {shown}  {t.block_bits:5.2f}  {t.note}{flag}\n")
    if source is None:
        sys.stdout.write("BPW 8B: a whole file's bits per weight, mix included (llama.cpp's sizes for Llama-3-8B; "
                         "nominal for IQ/TQ types); BLOCK: the main tensor format alone. "
                         "With a MODEL: the size each type would give it.\n")


def _with_progress(work, label: str):
    console = err_console()
    if not animated(console):
        return work(None)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), console=console,
                  transient=True) as progress:
        task = progress.add_task(f"quantizing to {label}", total=None)

        def update(done: int, total: int, tensor: str) -> None:
            progress.update(task, completed=done, total=total, description=f"quantizing {tensor}")

        return work(update)


def eval_models(
    models: list[str] = typer.Argument(..., help="One model, or several to compare (the first is the base).", show_default=False, autocompletion=o.complete_model),
    text: Optional[Path] = typer.Option(None, "--text", help="The evaluation text [default: the text that ships with tallow].", show_default=False),
    ctx: int = typer.Option(512, "--ctx", min=16, help="Window size in tokens (each window's second half is scored)."),
    chunks: Optional[int] = typer.Option(None, "--chunks", min=1, help="Score at most this many windows.", show_default=False),
    kl_base: Optional[str] = typer.Option(None, "--kl-base", help="Also measure KL divergence from this model.", show_default=False),
    compare: bool = typer.Option(False, "--compare", help="Print the trade-off table (implied by several models)."),
    flash_attn: str = typer.Option("on", "--flash-attn", help="Flash attention, on or off: pinned, as every setting that moves the figure is (llama-perplexity's default is on)."),
    cache_type_k: Optional[str] = typer.Option(None, "--cache-type-k", "--ctk", help="Also evaluate with this KV cache K type, against the first model at f16 (as tallow run takes it).", show_default=False),
    cache_type_v: Optional[str] = typer.Option(None, "--cache-type-v", "--ctv", help="... and this V type (a quantized V turns flash attention on for every row).", show_default=False),
    threads: o.Threads = None,
    as_json: o.Json = False,
    offline: o.Offline = False,
) -> None:
    """Measure perplexity and KL divergence on a text.

    With several models, the first is the base the others' KL divergence is measured from.
    With --cache-type-k/-v, the first model at an f16 KV cache is the base, and every model
    gets a row at those types.

    Example: tallow eval smollm2:135m-f16 smollm2:135m-Q8_0 smollm2:135m-Q4_K_M
    """
    from tallow.quantize.compare import compare_models

    body = text.read_text(encoding="utf-8", errors="replace") if text else None
    flash = o.parse_flash_attn(flash_attn)
    if flash == "auto":
        raise typer.BadParameter("eval pins flash attention so that its figure is the same on every machine: give on "
                                 "or off", param_hint="--flash-attn")
    kv = None
    if cache_type_k is not None or cache_type_v is not None:
        if kl_base:
            raise typer.BadParameter("the KV rows are measured against the first model at f16; drop --kl-base",
                                     param_hint="--cache-type-k")
        type_k, type_v, _ = o.cache_types(cache_type_k or "f16", cache_type_v or "f16", flash)
        kv = (type_k, type_v)
    names = ([kl_base] if kl_base else []) + list(models)
    local = [find_model(m, offline=offline) for m in names]
    # Pinned: the figure must not depend on this machine's calibration (flash attention,
    # repacked kernels) nor on the batch a default would pick.
    load = replace(o.load_settings(ctx, threads, "auto", flash), n_batch=512, repack=False)
    results = _with_eval_progress(lambda progress: compare_models(
        local, load, body, ctx, chunks,
        with_base=bool(kl_base) or len(models) > 1, with_speed=compare or len(models) > 1, on_progress=progress, kv=kv))
    if kl_base:
        results = results[1:]
    _print_results(results, as_json, table=compare or len(models) > 1 or kv is not None)


def _with_eval_progress(work):
    console = err_console()
    if not animated(console):
        return work(None)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), console=console,
                  transient=True) as progress:
        task = progress.add_task("evaluating", total=None)

        def update(model: str, done: int, total: int) -> None:
            progress.update(task, completed=done, total=total, description=f"evaluating {model}")

        return work(update)


def _print_results(results, as_json: bool, table: bool) -> None:
    import json

    if as_json:
        sys.stdout.write(json.dumps([r.to_dict() for r in results]) + "\n")
        return
    base = results[0]
    settings = (f"flash attention {base.flash_attn}, {base.windows_per_batch} windows a batch in calls of "
                f"{base.n_batch}, repacked weights "
                f"{'on' if base.repacked else 'off'}, {base.gpu_layers} layers on a GPU")
    if not table:
        r = base
        line = f"{r.model}: perplexity {r.ppl:.4f} ± {r.ppl_se:.4f} ({r.scored} tokens scored in {r.windows} windows of {r.n_ctx})"
        if r.kld is not None:
            line += f"; KL divergence {r.kld:.5f} ± {r.kld_se:.5f}; top-1 agreement {r.top1:.1%}"
        sys.stdout.write(f"{line}\n  ({settings}, KV cache {r.type_k}/{r.type_v})\n")
        return
    width = max(28, *(len(r.model) for r in results))
    head = f"{'model':<{width}} {'size':>9} {'bpw':>6} {'perplexity':>18} {'Δppl':>8} {'KLD':>9} {'top-1':>7} {'tok/s':>7}\n"
    sys.stdout.write(head)
    for r in results:
        dppl = (r.ppl / base.ppl - 1) * 100
        kld = f"{r.kld:.5f}" if r.kld is not None else "-"
        top1 = f"{r.top1:.1%}" if r.top1 is not None else "-"
        tps = f"{r.decode_tps:.1f}" if r.decode_tps else "-"
        sys.stdout.write(f"{r.model:<{width}} {human_bytes(r.size):>9} {r.bits_per_weight:6.2f} "
                         f"{r.ppl:9.4f} ± {r.ppl_se:6.4f} {dppl:+7.2f}% {kld:>9} {top1:>7} {tps:>7}\n")
    sys.stdout.write(f"({settings}; KV cache f16 unless the row says)\n")


def imatrix(
    model: str = typer.Argument(..., help="The model to measure (usually the F16 source you will quantize).", show_default=False, autocompletion=o.complete_model),
    text: Optional[Path] = typer.Option(None, "--text", help="Calibration text [default: the text that ships with tallow].", show_default=False),
    output: Path = typer.Option(Path("imatrix.gguf"), "--output", "-o", help="Where to write the importance matrix."),
    ctx: int = typer.Option(512, "--ctx", min=16, help="Window size in tokens."),
    chunks: Optional[int] = typer.Option(None, "--chunks", min=1, help="Use at most this many windows.", show_default=False),
    threads: o.Threads = None,
    offline: o.Offline = False,
) -> None:
    """Compute an importance matrix for quantize --imatrix.

    From calibration text: the activations each weight meets, so quantization keeps the
    weights that matter most.

    Example: tallow imatrix ./model-f16.gguf --text calibration.txt -o model.imatrix.gguf
    """
    from tallow.quantize.imatrix import compute_imatrix, write_imatrix

    body = text.read_text(encoding="utf-8", errors="replace") if text else None
    local = find_model(model, offline=offline)
    stats, used = _with_eval_progress(lambda progress: compute_imatrix(
        local, body, ctx, chunks, o.load_settings(ctx, threads, "0", "auto"),
        (lambda d, t: progress(local.name, d, t)) if progress else None))
    write_imatrix(stats, output, str(text) if text else "tallow eval.txt", used, ctx)
    err_console().print(f"wrote {output}: {len(stats.sums)} weight matrices, {used} windows of {ctx} tokens", soft_wrap=True)
