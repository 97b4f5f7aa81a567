"""What every layer of tallow uses: its error type and small file helpers (docs/DESIGN.md, "Layout and layers")."""
