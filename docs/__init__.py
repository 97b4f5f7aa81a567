"""The manual's pages, shipped with the package as data for `tallow docs` (cli/commands/docs_cmd.py)."""
