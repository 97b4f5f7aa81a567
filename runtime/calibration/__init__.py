"""Machine calibration: CPU facts, the probe child processes, and the cached profile."""
