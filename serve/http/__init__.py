"""HTTP plumbing that the front and the runner apps share: the guard, body reading, error shapes, CORS, Prometheus pages, replica state."""
