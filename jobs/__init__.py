"""Offline jobs: JSONL batches (local and over a fleet of servers), tallow embed's pipeline, and the vector index."""
