"""Embedding inference: the embedder over a pooling context and its batching scheduler."""
