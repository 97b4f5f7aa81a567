"""Tool calling (docs/DESIGN.md, "Tool calls"): the tools a request offers and how the prompt
shows them (`choice`), the grammar that makes calls parse (`constrain`, `envelope`) and the
sampler that starts it when a call opens (`sampler`), and reading calls back out of an
answer, whole or streamed (`stream`, `parse`). What differs between formats is one module
per family (`hermes`, `llama3`, `mistral`, `generic`), found by name in `formats`."""
