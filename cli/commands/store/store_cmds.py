"""tallow list, show, rm, cp and import: the model store (pull is in hub_cmds.py)."""

from __future__ import annotations

import json
import sys
from datetime import datetime
from typing import Any, Optional

import typer

from tallow.cli import options as o
from tallow.cli.models import store
from tallow.cli.render import err_console, human_bytes, human_count, out_console
from tallow.common.errors import TallowError
from tallow.models.gguf_file import read_gguf
from tallow.models.projector import ProjectorFacts
from tallow.models.refs import PathRef, parse_ref


def _print_json(data) -> None:
    sys.stdout.write(json.dumps(data, ensure_ascii=False, indent=None) + "\n")


def list_models(as_json: o.JsonList = False) -> None:
    """List stored models.

    Example: tallow list
    """
    st = store()
    found, problems = st.all()
    rows: list[dict[str, Any]] = []
    for m, path in sorted(found, key=lambda mp: mp[0].name):
        rows.append({
            "name": m.name,
            "quantization": m.gguf.get("file_type"),
            "size": m.size,
            "parameters": m.gguf.get("parameters"),
            "context_length": m.gguf.get("context_length"),
            "modified": datetime.fromtimestamp(m.created or path.stat().st_mtime).isoformat(timespec="seconds"),
            "linked": any(f.linked for f in m.stored_files),
            "media": ProjectorFacts.from_json(m.projector_facts).capabilities if m.projector else
            ["transcription"] if m.kind == "whisper" else [],
        })
    for line in problems:
        err_console().print(f"warning: unreadable manifest {line}", soft_wrap=True)
    if as_json:
        _print_json(rows)
        return
    from rich.table import Table

    table = Table(box=None, pad_edge=False, header_style="bold")
    for col in ("NAME", "QUANT", "SIZE", "PARAMS", "CONTEXT", "MODIFIED"):
        table.add_column(col, no_wrap=True)
    for r in rows:
        marks = r["media"] + (["linked"] if r["linked"] else [])
        table.add_row(r["name"] + (f" ({', '.join(marks)})" if marks else ""), r["quantization"] or "-", human_bytes(r["size"]),
                      human_count(r["parameters"]), str(r["context_length"] or "-"), r["modified"].replace("T", " "))
    out_console().print(table)


def show(
    model: o.Model,
    template: bool = typer.Option(False, "--template", help="Print only the chat template."),
    modelfile: bool = typer.Option(False, "--modelfile", help="Print a Modelfile that makes this model again (tallow create)."),
    parameters: bool = typer.Option(False, "--parameters", help="Print every request parameter's value for this model (its own PARAMETERs, else tallow's defaults), with its range."),
    fit: bool = typer.Option(False, "--fit", help="Print the memory it needs (weights, KV cache, compute), without loading it."),
    ctx: o.Ctx = None,
    gpu_layers: o.GpuLayers = "auto",
    vram: Optional[str] = typer.Option(None, "--vram", help="With --fit: plan for a GPU with this much free memory (e.g. 8GB), whether or not this machine has one.", show_default=False),
    cache_type_k: o.CacheTypeK = "f16",
    cache_type_v: o.CacheTypeV = "f16",
    as_json: o.Json = False,
) -> None:
    """Show a model's metadata, tensor types, license and source.

    \b
    Examples:
      tallow show smollm2:135m
      tallow show smollm2:135m --fit --ctx 8192
      tallow show smollm2:135m --fit --gpu-layers 20 --vram 4GB
      tallow show smollm2:135m --fit --ctx 32768 --cache-type-k q8_0 --cache-type-v q8_0
      tallow show terse --modelfile
    """
    kv, vram_bytes = _fit_flags(fit, cache_type_k, cache_type_v, vram)
    from tallow.models.resolve import LocalModel, locate

    st = store()
    found = locate(model, st)
    if not isinstance(found, LocalModel):
        raise TallowError(f"model {model!r} is not stored", f"pull it first: tallow pull {model}")
    manifest = st.get(found.name) if not isinstance(parse_ref(model), PathRef) else None
    if found.kind == "whisper":
        return _show_whisper(found, manifest, {"--fit": fit, "--parameters": parameters, "--modelfile": modelfile,
                                               "--template": template}, as_json)
    if fit:
        _show_fit(found, ctx, gpu_layers, as_json, vram_bytes, kv)
        return
    if parameters:
        _show_parameters(manifest.preset if manifest else None, as_json)
        return
    if modelfile:
        from tallow.models.create import modelfile_of
        from tallow.models.modelfile import render
        from tallow.models.preset import Preset

        sys.stdout.write(modelfile_of(st, manifest) if manifest else render(str(found.path), Preset()))
        return
    _show_info(found, manifest, template, as_json)


def _show_whisper(found, manifest, flags: dict[str, bool], as_json: bool) -> None:
    """A Whisper model's facts: it has no GGUF header, template or memory plan to show."""
    given = [f for f, on in flags.items() if on]
    if given:
        raise TallowError(f"{given[0]} does not apply to {found.name}, a Whisper model for tallow transcribe")
    facts = manifest.gguf
    data = {"name": found.name, "architecture": "whisper", "format": facts.get("format"),
            "languages": facts.get("languages"), "size": manifest.size, "license": manifest.license,
            "source": manifest.source, "capabilities": ["transcription"] + (["translation"] if facts.get("multilingual") else []),
            "files": {f.path: str(st_path) for f, st_path in zip(manifest.files, store().paths(manifest))}}
    if as_json:
        _print_json(data)
        return
    sys.stdout.write(f"{data['name']}\n")
    for label, value in (("architecture", "whisper (speech to text)"), ("format", data["format"]),
                         ("languages", data["languages"]), ("size", human_bytes(data["size"])),
                         ("license", data["license"] or "-"),
                         ("source", ", ".join(f"{k}={v}" for k, v in data["source"].items())),
                         ("capabilities", ", ".join(data["capabilities"]))):
        sys.stdout.write(f"  {label:<15}{value}\n")
    sys.stdout.write("  files\n")
    for name, where in data["files"].items():
        sys.stdout.write(f"    {name:<26}{where}\n")


def _fit_flags(fit: bool, cache_type_k: str, cache_type_v: str, vram: str | None):
    """(the KV types and flash attention, the GPU's free memory) a --fit plan is made for."""
    if (cache_type_k, cache_type_v) != ("f16", "f16") and not fit:
        raise typer.BadParameter("the KV cache's types change the plan: add --fit", param_hint="--cache-type-k")
    kv = o.cache_types(cache_type_k, cache_type_v, "auto") if fit else ("f16", "f16", "auto")
    if vram is None:
        return kv, None
    from tallow.env.settings import parse_size

    vram_bytes = parse_size(vram)
    if vram_bytes is None or not fit:
        raise typer.BadParameter("give a size such as 8GB or 512MiB, with --fit" if vram_bytes is None else
                                 "--vram plans a load: add --fit", param_hint="--vram")
    return kv, vram_bytes


def _show_info(found, manifest, template: bool, as_json: bool) -> None:
    """The model's facts (or its chat template alone), as text or JSON."""
    infos = [read_gguf(p) for p in found.paths]
    info = infos[0]
    preset = manifest.preset if manifest else None
    chat = (preset.template if preset else None) or info.metadata.get("tokenizer.chat_template")
    if template:
        if not isinstance(chat, str):
            raise TallowError(f"{found.name} has no chat template")
        sys.stdout.write(chat if chat.endswith("\n") else chat + "\n")
        return
    hist: dict[str, list[int]] = {}
    for i in infos:
        for name, (count, size) in i.type_histogram().items():
            h = hist.setdefault(name, [0, 0])
            h[0] += count
            h[1] += size
    data = {
        "name": found.name,
        "architecture": info.architecture,
        "parameters": sum(i.n_params for i in infos),
        "file_type": info.file_type,
        "context_length": info.context_length,
        "size": sum(i.size for i in infos),
        "license": (manifest.license if manifest else None) or info.metadata.get("general.license"),
        "source": manifest.source if manifest else {"kind": "file"},
        "files": [str(p) for p in found.paths],
        "tensor_types": {k: {"tensors": v[0], "bytes": v[1]} for k, v in sorted(hist.items(), key=lambda kv: -kv[1][1])},
        "metadata": {k: v for k, v in info.metadata.items() if isinstance(v, (str, int, float, bool)) and k != "tokenizer.chat_template"},
        "has_chat_template": isinstance(chat, str),
        "pooling": _pooling(info.metadata),
        "embedding_length": info.metadata.get(f"{info.architecture}.embedding_length"),
        "preset": preset.to_json() if preset else None,
        "adapters": [str(p) for p in found.adapters],
    }
    data.update(_projector_part(found, manifest, "embedding" if data["pooling"] else "completion"))
    if as_json:
        _print_json(data)
        return
    _render_show(data)


def _show_parameters(preset, as_json: bool) -> None:
    """Each request field of the table (common/fields.py) by its Modelfile name: the model's
    value where its preset sets one, else the default; its range and meaning."""
    from tallow.common.fields import FIELDS

    own = preset.parameters if preset is not None else {}
    rows = []
    for f in FIELDS:
        name = f.on("modelfile") or f.name
        rows.append({"name": name, "value": own.get(name, f.default), "source": "model" if name in own else "default",
                     "range": f.span(".."), "help": f.help})
    if as_json:
        _print_json(rows)
        return
    for r in rows:
        value = "(none)" if r["value"] in (None, ()) else r["value"]
        sys.stdout.write(f"{r['name']:<18} {str(value):<12} {r['source']:<8} {r['range']:<24} {r['help']}\n")


def _show_fit(found, ctx: int | None, gpu_layers: str, as_json: bool, vram: int | None,
              kv: tuple[str, str, str]) -> None:
    """The estimate a load would make, and whether it fits here; nothing is loaded. With a
    GPU (this machine's, or one `vram` describes) the offloaded layers' share is split off.
    `kv`: the KV cache's types and the flash attention they need."""
    from dataclasses import replace

    from tallow.runtime.host.devices import gpu_free_memory
    from tallow.runtime.loadplan import check_kv_types, plan_memory

    vram = vram if vram is not None else gpu_free_memory()
    load = replace(o.load_settings(ctx, None, gpu_layers, kv[2], kv[0], kv[1]), mmproj=found.mmproj)
    check_kv_types(found.paths, load)
    plan = plan_memory(found.paths, load, offload_supported=vram is not None, vram=vram)
    est, ram, note, verdict = plan.estimate, plan.ram, plan.note, plan.problem
    data = {"name": found.name, **est.to_dict(), "available_memory": ram, "fits": verdict is None,
            "flash_attn": plan.flash_attn, "extra_buffers": plan.extra_buffers, "type_k": load.type_k,
            "type_v": load.type_v}
    if verdict is not None:
        data["error"], data["hint"] = verdict.message, verdict.hint
    if note:
        data["note"] = note
    if as_json:
        _print_json(data)
        return
    out = sys.stdout
    gpu = f", {est.gpu_layers} layers on the GPU" if est.gpu_layers else ""
    types = "" if (load.type_k, load.type_v) == ("f16", "f16") else f", KV cache {load.type_k}/{load.type_v}"
    out.write(f"{found.name} at context {est.n_ctx} (flash attention {plan.flash_attn}, "
              f"repacked weights {'on' if plan.extra_buffers else 'off'}{gpu}{types})\n")
    rows = (("weights", "weights"), ("KV cache", "kv_cache"), ("compute", "compute"), ("output", "output"),
            *((("projector", "projector"),) if est.projector else ()), ("total", "total"))
    for label, key in rows:
        out.write(f"  {label:<10}{human_bytes(data[key]):>10}\n")
    if est.vram:
        out.write(f"  {'in RAM':<10}{human_bytes(est.ram):>10}\n  {'on GPU':<10}{human_bytes(est.vram):>10}"
                  f"  of {human_bytes(vram or 0)} free\n")
    out.write(f"  {'available':<10}{human_bytes(ram):>10}\n")
    out.write("  fits\n" if verdict is None else f"  does not fit: {verdict.message}\n  {verdict.hint}\n")
    if note:
        out.write(f"  note: {note}\n")


def _projector_part(found, manifest, kind: str) -> dict:
    """show's capabilities and projector: what the model can take, and through which file."""
    if found.mmproj is None or manifest is None or manifest.projector is None:
        return {"capabilities": [kind], "projector": None}
    facts = ProjectorFacts.from_json(manifest.projector_facts)
    return {"capabilities": [kind, *facts.capabilities],
            "projector": {"file": str(found.mmproj), "name": manifest.projector.path, "type": ", ".join(facts.types),
                          "size": manifest.projector.size, "parameters": facts.parameters,
                          "file_type": facts.file_type, "width": facts.width}}


def _render_show(d: dict) -> None:
    out = sys.stdout
    out.write(f"{d['name']}\n")
    for label, value in (("architecture", d["architecture"]), ("parameters", human_count(d["parameters"])),
                         ("quantization", d["file_type"]), ("context length", d["context_length"]),
                         ("size", human_bytes(d["size"])), ("license", d["license"] or "-"),
                         ("source", ", ".join(f"{k}={v}" for k, v in d["source"].items() if k != "files")),
                         ("chat template", "yes (tallow show --template)" if d["has_chat_template"] else "none"),
                         ("capabilities", ", ".join(d["capabilities"]))):
        out.write(f"  {label:<15}{value}\n")
    if d["projector"]:
        p = d["projector"]
        out.write(f"  {'projector':<15}{p['name']} ({p['type']}, {p['file_type'] or '?'}, {human_count(p['parameters'])} "
                  f"parameters, {human_bytes(p['size'])})\n")
    if d["preset"]:
        out.write(f"  {'settings':<15}{_preset_line(d['preset'])} (tallow show --modelfile)\n")
    for i, adapter in enumerate(d["adapters"]):
        out.write(f"  {'adapter' if i == 0 else '':<15}{adapter} (LoRA, id {i})\n")
    if d["pooling"]:
        kind = "a reranker: /v1/rerank" if d["pooling"] == "rank" else "tallow embed, /v1/embeddings"
        out.write(f"  {'embeddings':<15}{d['embedding_length']} dimensions, {d['pooling']} pooling ({kind})\n")
    out.write("  tensor types\n")
    for name, t in d["tensor_types"].items():
        out.write(f"    {name:<8} {t['tensors']:>5} tensors  {human_bytes(t['bytes']):>10}\n")
    out.write("  files\n")
    for f in d["files"] + ([d["projector"]["file"]] if d["projector"] else []):
        out.write(f"    {f}\n")


def _preset_line(p: dict) -> str:
    parts = [f"{k}={v}" for k, v in p["parameters"].items()]
    if p.get("system") is not None:
        parts.append(f"system prompt {p['system'][:40]!r}")
    if p.get("messages"):
        parts.append(f"{len(p['messages'])} few-shot turns")
    if p.get("template") is not None:
        parts.append("its own chat template")
    return ", ".join(parts)


def rm(
    models: list[str] = typer.Argument(..., help="Stored model names.", show_default=False, autocompletion=o.complete_model),
    dry_run: bool = typer.Option(False, "--dry-run", help="Say what would be removed and freed; remove nothing."),
) -> None:
    """Remove models from the store.

    Blobs no other model uses are deleted; linked files never are.

    Example: tallow rm smollm2:135m --dry-run
    """
    st = store()
    plan = st.plan_removal(models)
    if not dry_run:
        st.execute(plan)
    verb = "would remove" if dry_run else "removed"
    con = err_console()
    for name, _ in plan.manifests:
        con.print(f"{verb} {name}", soft_wrap=True)
    for path in plan.linked:
        con.print(f"kept linked file {path}", soft_wrap=True)
    con.print(f"{'would free' if dry_run else 'freed'} {human_bytes(plan.bytes_freed)}", soft_wrap=True)


def cp(
    source: str = typer.Argument(..., help="A stored model name.", show_default=False, autocompletion=o.complete_model),
    destination: str = typer.Argument(..., help="The new name.", show_default=False),
) -> None:
    """Copy a model to another name.

    Only the manifest is written: both names use the same files.

    Example: tallow cp smollm2:135m mine:latest
    """
    copied = store().copy(source, destination)
    err_console().print(f"copied {source} to {copied.name}", soft_wrap=True, markup=False, highlight=False)


def _pooling(metadata) -> str | None:
    from tallow.models.convert.bert_import import pooling_name  # numpy and safetensors: only for show

    return pooling_name(metadata)
