"""An MCP server written with the official SDK, for the tests: notes to read, and ways to
misbehave chosen by NOTES_MODE (slow: never answers in time; huge: a megabyte back; crash:
the process dies on a call; fail: the tool raises); with NOTES_LOG, each call it runs is a
line in that file. `python mcp_servers.py [stdio|http PORT]`.

`caller_model` writes the synthetic model the tests drive it with: its script calls
notes_read_note for the groceries and, once the prompt ends after a tool result (its
template adds '~' only then), answers "OK"."""

from __future__ import annotations

import os
import sys
import time

NOTE = "the note {name} says: buy oat milk"
CALL = '{"name": "notes_read_note", "arguments": {"name": "groceries"}}'


def caller_model(path, **more):
    from helpers.synth import HERMES, write_synthetic_gguf

    loop = HERMES.replace("{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
                          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
                          "{% if messages[-1]['role'] == 'tool' %}{{ '~' }}{% endif %}{% endif %}")
    assert loop != HERMES
    return write_synthetic_gguf(path, template=loop,
                                script={"\n": "<tool_call>", "<tool_call>": CALL, CALL: "</tool_call>",
                                        "</tool_call>": "<|im_end|>", "~": "O", "O": "K", "K": "<|im_end|>"},
                                extra_tokens=("<tool_call>", "</tool_call>", CALL), **more)


def build():
    from mcp.server.mcpserver import MCPServer

    app = MCPServer("notes")
    mode = os.environ.get("NOTES_MODE", "")

    @app.tool()
    def read_note(name: str) -> str:
        """Read one of the user's notes by its name."""
        if os.environ.get("NOTES_LOG"):
            with open(os.environ["NOTES_LOG"], "a") as log:
                log.write(f"read_note {name}\n")
        if mode == "slow":
            time.sleep(600)
        if mode == "huge":
            return "x" * 1_000_000
        if mode == "crash":
            os._exit(3)
        if mode == "fail":
            from mcp.server.mcpserver.exceptions import ToolError

            raise ToolError(f"no note is called {name}")
        return NOTE.format(name=name)

    @app.tool()
    def list_notes() -> list[str]:
        """The names of the user's notes."""
        return ["groceries", "ideas"]

    return app


if __name__ == "__main__":
    server = build()
    if len(sys.argv) > 2 and sys.argv[1] == "http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run("stdio")
