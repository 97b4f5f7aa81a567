"""The commands: one module per command or group, each thin: parse, call one service, render."""
