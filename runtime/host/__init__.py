"""The machine under the engine: ggml's devices, the thread governor, Ctrl-C inside native calls."""
