"""The engine and what drives it: load, tokenize, template, the sequence core, schedule, decode, cache, calibrate, embed, tool calls."""
