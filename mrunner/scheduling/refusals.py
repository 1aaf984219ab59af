"""What the loader tells a request it will not serve: shutting down, draining, or a full queue."""

from __future__ import annotations

from mrunner.errors import Unavailable

DRAINING = (
    "this mrunner node is draining: it finishes the requests it has and takes no new ones;"
    " send this request to another node, or try again once this one has restarted"
)


def shutting_down() -> Unavailable:
    return Unavailable("mrunner is shutting down; try again once it has restarted", code="shutting_down")


def draining() -> Unavailable:
    return Unavailable(DRAINING, code="draining", retry_after=1.0)


def queue_full(max_queue: int, advice: str) -> Unavailable:
    message = f"too many requests waiting ({max_queue}); {advice}"
    return Unavailable(message, code="queue_full", retry_after=1.0)
