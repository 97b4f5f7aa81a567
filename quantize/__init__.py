"""Quantization and its quality cost: quantize a model, and measure perplexity and KL divergence."""
