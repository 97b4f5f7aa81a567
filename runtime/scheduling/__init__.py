"""Many requests in one context: the scheduler, its steps, admission, handles, forks and counters."""
