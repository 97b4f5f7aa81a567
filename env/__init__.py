"""The environment as tallow's front doors (the CLI and `tallow.api`) see it: the registry of
environment variables (settings.py), this machine's profile (machine.py) and the places that
follow from them (site.py). Only the front doors import this package; everything below takes
explicit arguments (docs/DESIGN.md, "Layout and layers")."""
