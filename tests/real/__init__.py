"""Tests with real processes: llama-server, the daemon, a registry, a browser."""
