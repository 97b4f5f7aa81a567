"""tallow serve: the runner app (one model per process), the multi-model front, and the HTTP plumbing both share."""
