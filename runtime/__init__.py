"""The engine: load, tokenize, template, decode, stream typed events."""
