"""tallow quantize and tallow eval: make smaller models, and measure what that cost."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from . import options as o
from .models import find_model, store
from .render import err_console, human_bytes


def _default_name(source_name: str, type_name: str) -> str:
    repo, _, tag = source_name.partition(":")
    if source_name.endswith(".gguf") or "/" in source_name and Path(source_name).exists():
        from .store_cmds import default_name

        return f"{default_name(Path(source_name))}:{type_name}"
    return f"{repo}:{tag}-{type_name}" if tag and tag != "latest" else f"{repo}:{type_name}"


def quantize(
    model: Optional[str] = typer.Argument(None, help="The source: a stored model or a .gguf file (F32, F16 or BF16).", show_default=False),
    type_: Optional[str] = typer.Option(None, "--type", help="The quantization type (see --list).", show_default=False),
    name: Optional[str] = typer.Option(None, "--name", help="The new model's name [default: the source's, with the type].", show_default=False),
    imatrix: Optional[Path] = typer.Option(None, "--imatrix", help="An importance matrix file (tallow imatrix).", show_default=False),
    allow_requantize: bool = typer.Option(False, "--allow-requantize", help="Allow an already quantized source (costs quality)."),
    leave_output_tensor: bool = typer.Option(False, "--leave-output-tensor", help="Keep output.weight unquantized."),
    pure: bool = typer.Option(False, "--pure", help="Every tensor in the chosen type (no mix)."),
    output_tensor_type: Optional[str] = typer.Option(None, "--output-tensor-type", help="The type of output.weight.", show_default=False),
    token_embedding_type: Optional[str] = typer.Option(None, "--token-embedding-type", help="The type of token_embd.weight.", show_default=False),
    threads: o.Threads = None,
    list_types: bool = typer.Option(False, "--list", help="List every type with its bits per weight, and exit."),
    offline: o.Offline = False,
) -> None:
    """Quantize a model into a new stored model (in a child process; nothing is kept on failure).

    Example: tallow quantize ./model-f16.gguf --type Q4_K_M --name mymodel:q4
    """
    from tallow.quantize.types import TYPES

    if list_types:
        for t in TYPES:
            flag = "  (needs --imatrix)" if t.needs_imatrix else ""
            sys.stdout.write(f"{t.name:<8} {t.bits_per_weight:5.2f} bpw  {t.note}{flag}\n")
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


def _with_progress(work, label: str):
    console = err_console()
    if not console.is_terminal:
        return work(None)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), console=console,
                  transient=True) as progress:
        task = progress.add_task(f"quantizing to {label}", total=None)

        def update(done: int, total: int, tensor: str) -> None:
            progress.update(task, completed=done, total=total, description=f"quantizing {tensor}")

        return work(update)
