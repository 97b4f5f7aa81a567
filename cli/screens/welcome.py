"""`tallow` alone, on a terminal: the stored models and the handful of commands to start
with, instead of the usage text (which `tallow --help`, and a bare `tallow` in a pipe, still
print)."""

from __future__ import annotations

from tallow.cli.models import store
from tallow.cli.render import human_bytes, out_console

FIRST_STEPS = (
    ('tallow run smollm2:135m "Why is the sky blue?"', "one answer, streamed (fetches the default model once)"),
    ("tallow chat MODEL", "a chat in the terminal"),
    ("tallow find QUERY", "search the hub for a model that fits this machine"),
    ("tallow pull ORG/REPO", "download one: the largest quantization that fits"),
    ("tallow serve", "OpenAI, Anthropic and Ollama APIs on 127.0.0.1:8080"),
    ("tallow ui", "a chat page in the browser"),
    ("tallow --help", "every command"),
)


def welcome() -> int:
    console = out_console()
    found, _ = store().all()
    names = sorted((m for m, _ in found), key=lambda m: m.name)
    if names:
        console.print(f"Stored models ({len(names)}):", markup=False, highlight=False)
        for m in names[:12]:
            console.print(f"  {m.name:<32} {m.gguf.get('file_type') or '-':<8} {human_bytes(m.size)}",
                          markup=False, highlight=False)
        if len(names) > 12:
            console.print(f"  ... and {len(names) - 12} more: tallow list", markup=False, highlight=False)
    else:
        console.print("No models stored yet.", markup=False, highlight=False)
    console.print("\nStart with:", markup=False, highlight=False)
    width = max(len(cmd) for cmd, _ in FIRST_STEPS)
    for cmd, what in FIRST_STEPS:
        console.print(f"  {cmd:<{width}}  {what}", markup=False, highlight=False)
    return 0
