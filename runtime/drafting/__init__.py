"""Speculative decoding: lookup drafts, a draft model, and what drafting costs."""
