"""Inference backends: how to install one and how to start a runner of it."""
