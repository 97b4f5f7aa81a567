"""tallow launch: coding agents pointed at a tallow server, each through its own configuration."""
