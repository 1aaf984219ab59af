"""The web page's files (package data), served by L{mrunner.api.observe.page}."""
