"""The daemon's plumbing: starting, listening, reloading, logs, lazy TLS and its own metrics."""
