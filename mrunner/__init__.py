"""mrunner: one OpenAI-compatible endpoint for all your local models, on Twisted."""

__version__ = "0.1.0"
