"""tallow as a library: load a stored model by name and stream its answer, with the same
usage and timings the CLI prints, without the CLI or HTTP.

    from tallow import api

    with api.load("smollm2:135m") as model:
        for event in model.stream("Why is the sky blue?", max_tokens=64, temperature=0):
            if isinstance(event, api.TokenEvent):
                print(event.text, end="", flush=True)
        final = model.last  # the FinalEvent: finish_reason, usage, timings

A model is found where the CLI finds it (TALLOW_HOME, TALLOW_MODELS) and loaded as `tallow
run` loads it (the machine's calibration, the prompt cache on disk); `load` never
downloads: a model that is not stored is an error that says how to pull it.
"""

from __future__ import annotations

from tallow.api.model import Model, load
from tallow.common.errors import TallowError
from tallow.runtime.types import FinalEvent, Sampling, Timings, TokenEvent, Usage

__all__ = ["FinalEvent", "Model", "Sampling", "TallowError", "Timings", "TokenEvent", "Usage", "load"]
