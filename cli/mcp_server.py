"""tallow mcp serve: tallow as an MCP server on stdio, so that another agent can use a local
model as a tool: `generate` (an answer from MODEL), and with --index, `search` (the nearest
texts of a local index made by tallow embed --index). The model loads at the first call, once;
calls are answered one at a time."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from tallow.common.errors import TallowError


class Served:
    """The model behind the tools, opened on first use."""

    def __init__(self, model: str, threads: int | None, offline: bool) -> None:
        self.model, self.threads, self.offline = model, threads, offline
        self.engine: Any = None
        self.lock = threading.Lock()

    def generate(self, prompt: str, system: str, max_tokens: int, temperature: float) -> str:
        from tallow.runtime.protocol import final_of
        from tallow.runtime.types import Sampling

        with self.lock:
            engine = self._engine()
            messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
            request = engine.request(messages, max_tokens=max_tokens, sampling=Sampling(temperature=temperature))
            return final_of(engine.stream(request)).text

    def _engine(self):
        if self.engine is None:
            from tallow.cli import options as o
            from tallow.cli.models import find_model
            from tallow.runtime.opening import open_engine

            self.engine = open_engine(find_model(self.model, self.offline), o.load_settings(None, self.threads, "auto", "auto"),
                                      None, "no")
        return self.engine

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()


def build(served: Served, index: Path | None):
    """The MCP server and its tools."""
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError

    app = MCPServer("tallow", instructions=f"A local model ({served.model}) answering prompts"
                    + (", and a search over a local index of texts." if index else "."))

    @app.tool()
    def generate(prompt: str, system: str = "", max_tokens: int = 512, temperature: float = 0.7) -> str:
        """Answer a prompt with the local language model (its chat template applied)."""
        if not 1 <= max_tokens <= 32_768 or not 0.0 <= temperature <= 2.0:
            raise ToolError("max_tokens is 1 to 32768 and temperature 0 to 2")
        try:
            return served.generate(prompt, system, max_tokens, temperature)
        except TallowError as exc:
            raise ToolError(exc.message) from None

    if index is not None:
        @app.tool()
        def search(query: str, top: int = 5) -> list[dict[str, Any]]:
            """The stored texts nearest in meaning to the query, best first, with their scores."""
            from tallow.cli.commands.embed_cmds import nearest

            if not 1 <= top <= 100:
                raise ToolError("top is 1 to 100")
            try:
                hits = nearest(index, query, top, served.threads, served.offline)
            except TallowError as exc:
                raise ToolError(exc.message) from None
            return [{"id": h.id, "score": round(h.score, 6), "text": h.text} for h in hits]

    return app
