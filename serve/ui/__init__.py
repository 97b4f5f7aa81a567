"""tallow serve's chat page: its files and its conversations."""
