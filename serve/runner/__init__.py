"""The runner process: one model's ASGI app over its Scheduler (generation, embeddings, stored Responses)."""
