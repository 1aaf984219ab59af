"""Scheduling: install backends, load runners, share and evict them. No HTTP parsing here."""
