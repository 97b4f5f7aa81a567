"""The machine profile as the commands see it: where it is cached, how a notice is shown."""

from __future__ import annotations

import sys
from dataclasses import replace

from tallow.cli import settings


def probe_options(threads: int | None):
    from tallow.runtime.calibration.machine import ProbeOptions
    from tallow.runtime.threads import physical_cores

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
