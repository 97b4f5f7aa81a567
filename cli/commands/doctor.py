"""tallow doctor: what tallow knows about this machine, for a bug report, and a live check."""

from __future__ import annotations

import json
import platform
import sys

import typer

from tallow.cli import options as o
from tallow.env import settings


def _dir_size(path) -> int:
    total = 0
    try:
        for p in path.rglob("*"):
            if p.is_file() and not p.is_symlink():
                total += p.stat().st_size
    except OSError:
        pass
    return total


def _live_check(threads: int | None) -> dict:
    """Load the default model if it is stored and decode a few tokens."""
    from tallow.cli.models import store
    from tallow.models.catalog import SMOLLM2_135M
    from tallow.models.resolve import LocalModel, locate
    from tallow.runtime.engine import Engine
    from tallow.runtime.types import FinalEvent, Request, Sampling

    found = locate(SMOLLM2_135M.name, store())
    if not isinstance(found, LocalModel):
        return {"model": SMOLLM2_135M.name, "stored": False, "hint": f"tallow pull {SMOLLM2_135M.name}"}
    with Engine(found.paths, o.load_settings(512, threads, "auto", "auto")) as engine:
        request = Request(engine.tokenize("The sky is"), max_tokens=16, sampling=Sampling(temperature=0.0),
                          ignore_eos=True, disk_cache=False)
        final = [e for e in engine.stream(request)][-1]
        assert isinstance(final, FinalEvent)  # a stream ends with its final record
        t = final.timings
        return {"model": SMOLLM2_135M.name, "stored": True, "load_ms": round(engine.load_ms, 1),
                "prefill_tokens": t.prefill_tokens, "decode_tokens": t.decode_tokens,
                "decode_tok_s": round(t.decode_tokens / (t.decode_ms / 1000), 1) if t.decode_ms else None,
                "threads": engine.n_threads, "flash_attn": engine.flash_attn, "extra_buffers": engine.extra_buffers,
                "text": final.text}


def _threads_now(threads: int | None) -> int:
    """What an engine starting now would take: the cores other processes leave (a 0.2 s look)."""
    import time

    from tallow.runtime.host.threads import Governor, Registry, physical_cores

    gov = Governor(physical_cores(), threads, Registry(settings.engines_dir()))
    time.sleep(0.2)
    n = gov.start()
    gov.close()
    return n


def _check(checks: list, name: str, fn):
    try:
        value = fn()
    except Exception as exc:  # noqa: BLE001 - a failed check is a finding, not a crash
        checks.append({"name": name, "ok": False, "detail": getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"})
        return None
    checks.append({"name": name, "ok": True})
    return value


def gather(threads: int | None, live: bool, recalibrate: bool) -> dict:
    import psutil

    from tallow.cli.gpu import gpu_unused
    from tallow.cli.version import version
    from tallow.env.machine import machine_profile
    from tallow.runtime.calibration.machine import cpu_facts
    from tallow.runtime.host.threads import physical_cores

    checks: list[dict] = []
    facts = cpu_facts()
    interesting = [f for f in facts["flags"].split() if f.startswith(("avx", "amx", "fma", "f16c", "sve", "neon",
                                                                      "asimd", "dotprod", "i8mm"))]

    def llama():
        from tallow.runtime import backend

        backend.init()
        from tallow.runtime.calibration.machine import build_facts
        from tallow.runtime.host.devices import backends, devices

        info = {"llama_cpp_python": build_facts()["llama_cpp_python"], "system_info": backend.system_info()}
        return {"info": info, "devices": [d.__dict__ for d in devices()], "backends": backends()}

    lib = _check(checks, "llama.cpp", llama) or {"info": {}, "devices": [], "backends": []}
    prof = _check(checks, "calibration", lambda: machine_profile(threads, refresh=recalibrate))
    vm = psutil.virtual_memory()
    home = settings.home()
    data = {
        "tallow": version(), "python": platform.python_version(), "platform": platform.platform(),
        "llama_cpp_python": lib["info"].get("llama_cpp_python"), "system_info": lib["info"].get("system_info"),
        "cpu": {"model": facts["cpu"], "arch": facts["arch"], "kernel": facts["kernel"], "flags": interesting,
                "physical_cores": physical_cores(), "logical_cpus": psutil.cpu_count() or 1,
                "threads": threads or physical_cores(), "threads_now": _threads_now(threads)},
        "repack": None if prof is None else {"on": prof.repack, "reason": prof.repack_reason, "probed": prof.probed,
                                             "extra_buffer_types": prof.extra_buffer_types},
        "flash_attn": None if prof is None else _fa_summary(prof),
        "calibration": None if prof is None else {"key": prof.key, "seconds": prof.seconds,
                                                  "file": str(settings.machine_cache())},
        "backends": lib["backends"],
        "devices": lib["devices"],
        "gpu_unused": gpu_unused(lib["devices"]) if lib["backends"] else None,
        "decisions": _decisions(lib["devices"], prof),
        "memory": {"total": vm.total, "available": vm.available},
        "paths": {"home": str(home), "models": str(settings.models_dir()), "models_bytes": _dir_size(settings.models_dir()),
                  "prompt_cache": str(settings.prompt_cache_dir()), "prompt_cache_bytes": _dir_size(settings.prompt_cache_dir())},
        "offline": settings.offline(),
        "live": None,
    }
    if live and prof is not None and lib["devices"]:
        data["live"] = _check(checks, "live decode", lambda: _live_check(threads))
    data["checks"] = checks
    data["ok"] = all(c["ok"] for c in checks)
    return data


def _decisions(devices: list[dict], prof) -> dict:
    """Which rule decides threads, flash attention and repacking, where the layers run."""
    from tallow.runtime.host.threads import thread_rule

    repack = "as calibrated" if prof is None else ("on" if prof.repack else "off") + " (calibrated)"
    cpu = {"threads": thread_rule(None, True, False)[1],
           "flash_attn": "chosen for each context's work from the calibration", "repack": repack}
    gpus = [d["name"] for d in devices if d["kind"] in ("gpu", "igpu")]
    gpu = None if not gpus else {
        "devices": gpus, "threads": thread_rule(None, True, True)[1] + " (partly offloaded: as on the CPU)",
        "flash_attn": "llama.cpp's auto", "repack": "only for the weights left on the CPU"}
    return {"cpu": cpu, "gpu": gpu}


def _fa_summary(prof) -> dict | None:
    """The flash-attention timings (best of their rounds, as tokens/s), their noise (the
    median's excess over the best, per mode, the worst measurement's) and the load then."""
    t = prof.timings
    if not t:
        return {"error": prof.timing_error} if prof.timing_error else None
    noise = {mode: round(100 * max(s.values()), 1) for mode, s in (prof.spread or {}).items()}
    return {"depth": t["_depth"], **{mode: {k: round(1 / v, 1) for k, v in t[mode].items()} for mode in ("on", "off")},
            "unit": "tokens/s on the calibration model", "noise_pct": noise, "load": prof.load, "busy": prof.busy,
            "seen": prof.seen or None}


def _fa_row(f: dict) -> str:
    if "error" in f:
        return f["error"]
    noise = ", ".join(f"{mode} {pct:g}%" for mode, pct in f["noise_pct"].items()) or "?"
    verdict = ("measured while busy: llama.cpp's default until `tallow doctor --recalibrate` on a quiet machine"
               if f["busy"] else f"a run found it wrong ({f['seen']}): llama.cpp's default until "
               "`tallow doctor --recalibrate`" if f.get("seen") else
               "chosen per context, off only where it wins by more than the noise")
    return (f"decode tok/s at depth 0 / {f['depth']}: on {f['on']['decode_0']:.0f} / {f['on']['decode_deep']:.0f}, "
            f"off {f['off']['decode_0']:.0f} / {f['off']['decode_deep']:.0f} (calibration model; noise {noise}; "
            f"load {f['load']}; {verdict})")


def _render(d: dict) -> None:
    from tallow.cli.render import human_bytes, out_console

    con = out_console()
    cpu = d["cpu"]
    rows = [
        ("tallow", f"{d['tallow']} (Python {d['python']}, {d['platform']})"),
        ("llama.cpp", f"llama-cpp-python {d['llama_cpp_python']}"),
        ("built with", d["system_info"] or "?"),
        ("CPU", f"{cpu['model']} ({cpu['arch']}, kernel {cpu['kernel']})"),
        ("CPU flags", " ".join(cpu["flags"]) or "-"),
        ("cores", f"{cpu['physical_cores']} physical, {cpu['logical_cpus']} logical; tallow would start with "
                  f"{cpu['threads_now']} thread(s) now, up to {cpu['threads']}"),
    ]
    if d["repack"]:
        r = d["repack"]
        types = ", ".join(r["extra_buffer_types"]) or "none"
        rows.append(("repack", f"{'on' if r['on'] else 'off'}: {r['reason']} (extra buffer types: {types})"))
    if d["flash_attn"]:
        rows.append(("flash attn", _fa_row(d["flash_attn"])))
    if d["backends"]:
        rows.append(("backends", ", ".join(d["backends"])))
    if d["gpu_unused"]:
        g = d["gpu_unused"]
        rows.append(("GPU", f"{g['gpu']} found, but this llama.cpp cannot use it; rebuild: {g['command']}"))
    for dev in d["devices"]:
        rows.append(("device", f"{dev['name']} ({dev['kind']}, {dev['description']}): "
                     f"{human_bytes(dev['free'])} free of {human_bytes(dev['total'])}"))
    dec = d["decisions"]
    rows.append(("on the CPU", f"threads: {dec['cpu']['threads']}; flash attention: {dec['cpu']['flash_attn']}; "
                               f"repacked weights: {dec['cpu']['repack']}"))
    g = dec["gpu"]
    rows.append(("on a GPU", f"threads: {g['threads']}; flash attention: {g['flash_attn']}; repacking: {g['repack']}"
                 if g else "no GPU device here: every layer runs on the CPU"))
    rows += [
        ("memory", f"{human_bytes(d['memory']['available'])} available of {human_bytes(d['memory']['total'])}"),
        ("home", d["paths"]["home"]),
        ("models", f"{d['paths']['models']} ({human_bytes(d['paths']['models_bytes'])})"),
        ("prompt cache", f"{d['paths']['prompt_cache']} ({human_bytes(d['paths']['prompt_cache_bytes'])})"),
        ("offline", "yes" if d["offline"] else "no"),
    ]
    live = d["live"]
    if live and live.get("stored"):
        rows.append(("live check", f"{live['model']}: loaded in {live['load_ms']:.0f} ms, {live['decode_tok_s']} tok/s decode "
                     f"({live['threads']} threads, flash attn {live['flash_attn']})"))
    elif live:
        rows.append(("live check", f"skipped: {live['model']} is not stored (get it: {live['hint']})"))
    for c in d["checks"]:
        if not c["ok"]:
            rows.append(("FAILED", f"{c['name']}: {c['detail']}"))
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        con.print(f"{key:<{width}}  {value}")


def doctor(
    threads: o.Threads = None,
    as_json: o.Json = False,
    no_live: bool = typer.Option(False, "--no-live", help="Skip loading the default model."),
    recalibrate: bool = typer.Option(False, "--recalibrate", help="Measure this machine again (repack probe, flash attention)."),
) -> None:
    """Check this machine and the install, for a bug report.

    Example: tallow doctor --json
    """
    d = gather(threads, not no_live, recalibrate)
    if as_json:
        sys.stdout.write(json.dumps(d, ensure_ascii=False) + "\n")
    else:
        _render(d)
    if not d["ok"]:
        failed = ", ".join(c["name"] for c in d["checks"] if not c["ok"])
        sys.stderr.write(f"error: check failed: {failed}\n")
        raise typer.Exit(1)
