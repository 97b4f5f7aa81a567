"""The service layer over the runtime: the HTTP server, OpenAI's wire format, JSONL batch jobs and metrics."""
