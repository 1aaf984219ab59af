"""C{GET /engines/devices}: the build variant and each device's memory, the host's RAM (C{CPU}) last."""

from __future__ import annotations

from typing import Any

import attrs
from klein import Klein
from twisted.web.iweb import IRequest

from mrunner.api.documented import Documented
from mrunner.api.errors import handle_json_errors, json_body
from mrunner.api.openapi import Piece, answer, json_content, operation
from mrunner.interfaces import IDevices

DEVICE = {
    "type": "object",
    "required": ["id", "name", "memory_total", "memory_free", "budget", "used"],
    "properties": {
        "id": {"type": "string"},
        "name": {"type": "string"},
        **{key: {"type": "integer"} for key in ("memory_total", "memory_free", "budget", "used")},
    },
}
DEVICES = {
    "type": "object",
    "required": ["variant", "devices"],
    "properties": {"variant": {"type": "string"}, "devices": {"type": "array", "items": DEVICE}},
}


def devices_json(devices: IDevices, found: list[Any]) -> dict[str, Any]:
    return {"variant": devices.variant, "devices": [attrs.asdict(device) for device in found]}


class DevicesAPI:
    """The devices runners can use, looked at again (NVML, else ``llama-server --list-devices``) per call."""

    app = Klein()
    handle_json_errors(app)
    routes = Documented(app)

    def __init__(self, devices: IDevices) -> None:
        self._devices = devices

    def openapi(self) -> Piece:
        return self.routes.openapi()

    @routes.route(
        "/engines/devices",
        "GET",
        operation(
            "The llama-server variant and each device's memory: total, free, budget, used",
            {"200": answer("devices", json_content(DEVICES))},
        ),
    )
    async def devices(self, request: IRequest) -> bytes:
        found = await self._devices.refresh()
        return json_body(request, devices_json(self._devices, found))
