"""The package that talks to runners (mrunner/runners), a test module per module."""
