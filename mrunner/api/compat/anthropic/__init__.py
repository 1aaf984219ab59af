"""Anthropic's Messages API."""
