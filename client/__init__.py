"""Clients of other servers: an OpenAI-compatible endpoint, a remote engine and embedder for --endpoint, and the load generator."""
