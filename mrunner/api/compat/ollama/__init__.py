"""Ollama's API under C{/api}: its inference and its model management."""
