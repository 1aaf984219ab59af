"""The model-reference grammar, moved to L{mrunner.names} so the configuration reads it without
the store (issue 51); kept here for the store's importers until they import it from there."""

from mrunner.names import DIGEST, DOCKER_HUB, SHORT_ID, normal_name, parse, with_tag

__all__ = ["DIGEST", "DOCKER_HUB", "SHORT_ID", "normal_name", "parse", "with_tag"]
