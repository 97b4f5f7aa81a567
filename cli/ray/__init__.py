"""tallow on a Ray cluster: reaching it (connect.py), batch --ray (batch.py), serve --ray (serve.py)."""
