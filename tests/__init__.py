"""mrunner tests; run with ``python -m twisted.trial tests``."""
