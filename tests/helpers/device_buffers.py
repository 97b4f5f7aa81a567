"""What llama.cpp allocated on a GPU device, read from its own log as a model loads: the
model, KV and compute buffers it reports per backend device ("Vulkan0 model buffer size =
93.4 MiB"). Host-side buffers (CPU, CPU_Mapped, Vulkan_Host) are not the device's."""

from __future__ import annotations

import re
from pathlib import Path

DEVICE = re.compile(r"\b((?:Vulkan|CUDA|ROCm|Metal|SYCL)\d+) (model|KV|compute) buffer size = +([0-9.]+) MiB")


def load_and_read_buffers(model: Path, **settings) -> tuple[object, list[tuple[str, str, float]]]:
    """Load `model` in an Engine with LoadSettings(**settings) and close it; (the Engine's load
    estimate, [(device, buffer kind, MiB)])."""
    from tallow.runtime import backend
    from tallow.runtime.engine import Engine
    from tallow.runtime.types import LoadSettings

    backend.init()
    seen: list[tuple[str, str, float]] = []

    def listen(level, line):
        seen.extend((m[0], m[1], float(m[2])) for m in DEVICE.findall(line))

    backend.listen_to_logs(listen)
    try:
        with Engine(model, LoadSettings(**settings)) as engine:
            estimate = engine.estimate
    finally:
        backend.stop_listening(listen)
    return estimate, seen
