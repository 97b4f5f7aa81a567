"""MCP servers' tools for a local model: the `mcpServers` configuration Claude Desktop and
Cursor use (config.py), connections to its servers through the official SDK (hub.py), and
the loop that offers their tools to a model and runs the calls it makes (loop.py)."""
