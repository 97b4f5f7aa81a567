"""The machine profile as the commands see it: where it is cached, how a notice is shown."""

from __future__ import annotations

import sys
from dataclasses import replace

from tallow.env import settings


def probe_options(threads: int | None):
    from tallow.runtime.calibration.machine import ProbeOptions
    from tallow.runtime.host.threads import physical_cores

    hook, timeout = settings.test_probe()
    opts = ProbeOptions(mode=settings.cpu_repack(), threads=threads or physical_cores(),
                        fault=hook if hook in ("crash", "hang") else None, force_probe=hook is not None)
    return replace(opts, timeout_s=timeout) if timeout else opts


def machine_profile(threads: int | None, refresh: bool = False):
    """This machine's runtime.machine.Profile, calibrating once (a child process) if needed."""
    from tallow.runtime.calibration.machine import profile

    def notice(text: str) -> None:
        sys.stderr.write(text + "\n")
        sys.stderr.flush()

    return profile(settings.machine_cache(), probe_options(threads), notice, refresh=refresh)


class LazyProfile:
    """The machine profile, measured (or read from its cache) only when a load first reads it:
    after every check that can fail first (the model is stored, the flags are valid), so a
    mistake is told at once, not after a calibration."""

    def __init__(self, threads: int | None) -> None:
        self._threads = threads
        self._profile = None

    def __getattr__(self, name: str):
        if name.startswith("_"):  # copy, pickle and the like look for these: not the profile's
            raise AttributeError(name)
        if self._profile is None:
            self._profile = machine_profile(self._threads)
        return getattr(self._profile, name)

    def saw(self, why: str) -> None:
        """A run's speed said the calibration does not hold here (runtime/calibration/watch.py):
        said once, and kept with the profile, whose choices fall back to llama.cpp's defaults
        until it is measured again (a server's quiet moment, or tallow doctor --recalibrate)."""
        from tallow.runtime.calibration.machine import note_seen

        if self._profile is None:
            return
        sys.stderr.write(f"note: {why}; tallow uses llama.cpp's defaults until it measures this machine again "
                         "(tallow doctor --recalibrate)\n")
        try:
            note_seen(settings.machine_cache(), self._profile.key, why)
        except OSError:
            pass  # the note was said; a profile that cannot be written is measured again anyway


def load_settings(ctx: int | None, threads: int | None, gpu_layers: str, flash_attn: str):
    """LoadSettings from checked values and the CLI's settings: the context cap, debug logs,
    this machine's profile (on demand) and the engines' registry (the commands and
    tallow.api load alike)."""
    from tallow.runtime.types import LoadSettings

    return LoadSettings(n_ctx=ctx, ctx_cap=settings.context_length(), n_threads=threads, gpu_layers=gpu_layers,
                        flash_attn=flash_attn, echo_logs=settings.debug(), machine=LazyProfile(threads),
                        registry=settings.engines_dir())
