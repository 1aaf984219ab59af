"""The proxy (mrunner/proxy): the HTTP client that talks to runners, a test module per module."""
