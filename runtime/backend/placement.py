"""A model's placement over GPUs (runtime.types.Placement) set on llama.cpp's model parameters."""

from __future__ import annotations

import ctypes

import llama_cpp.llama_cpp as C

from tallow.runtime.host.devices import gpu_handles
from tallow.runtime.types import Placement

_SPLIT = {"none": 0, "layer": 1, "row": 2}


def place(params, placement: Placement) -> list:
    """Set the parameters' devices, split mode, main GPU and tensor split; returns the ctypes
    arrays, which must stay referenced until the model is loaded."""
    keep: list = []
    if placement.devices:
        handles = gpu_handles(placement.devices)
        arr = (ctypes.c_void_p * (len(handles) + 1))(*handles, None)  # NULL-terminated
        params.devices = ctypes.cast(arr, ctypes.c_void_p)
        keep.append(arr)
    params.split_mode = _SPLIT[placement.split_mode]
    params.main_gpu = placement.main_gpu
    if placement.tensor_split:
        split = (ctypes.c_float * C.llama_max_devices())(*placement.tensor_split)  # what llama.cpp reads
        params.tensor_split = split
        keep.append(split)
    return keep
