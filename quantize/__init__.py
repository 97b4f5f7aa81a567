"""Quantization and its quality cost (perplexity, KLD). Not built yet."""
