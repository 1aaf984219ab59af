"""Requests made with an API key, for the tests of keys and the hostile API."""

from __future__ import annotations

import json
from typing import Any

from tests.support.daemon import http


class Keyed:
    """Requests with a key, answered as JSON where they can be."""

    daemon: Any

    async def ask(
        self, method: str, path: str, key: str, body: bytes | dict[str, Any] | None = None
    ) -> tuple[int, Any]:
        data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        response = await http.request(
            method, self.daemon.url + path, data=data, headers={"Authorization": f"Bearer {key}"}
        )
        text = await response.text()
        try:
            return response.code, json.loads(text)
        except ValueError:
            return response.code, text
