"""``mrunner_device_memory_{total,free,budget,used}_bytes{device}`` for C{/metrics}, read at each scrape."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from mrunner.interfaces import IDevices

FIELDS = {
    "total": ("memory_total", "Each device's memory"),
    "free": ("memory_free", "Each device's free memory, as last seen"),
    "budget": ("budget", "What mrunner lets runners plan for on each device"),
    "used": ("used", "What mrunner's runners hold on each device"),
}


class DeviceCollector(Collector):
    """The devices as last seen (the page and C{/engines/devices} look again); the RAM is device C{CPU}."""

    def __init__(self, devices: IDevices) -> None:
        self._devices = devices

    def collect(self) -> Iterator[GaugeMetricFamily]:
        found = self._devices.devices()
        for name, (field, text) in FIELDS.items():
            family = GaugeMetricFamily(f"mrunner_device_memory_{name}_bytes", text, labels=["device"])
            for device in found:
                family.add_metric([device.id], getattr(device, field))
            yield family
