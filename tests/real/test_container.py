"""The image of ./Containerfile, built here with podman from Debian's packages: runs, serves, stops, pushes.

The first run on a machine builds the base and downloads the wheelhouse (minutes, once); later
runs reuse them and podman's layer cache (tests/support/container.py says what and how).
The podman calls block, so they run in threads while the reactor serves the registry.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import treq
from openai import OpenAI
from twisted.internet.defer import ensureDeferred
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import TestCase

from mrunner.testing.tinymodel import write_tiny_llama
from tests.support import container, registry_server
from tests.support.daemon import eventually, free_port

KEY = "key-for-the-container-test"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


class ImageTests(TestCase):
    skip = container.skip_reason() or registry_server.SKIP
    # A safety net: the first build on a machine runs mmdebstrap and compiles nothing, yet takes
    # ten minutes on a busy core (vfs copies every layer); later runs take seconds to a minute.
    timeout = 3600

    async def test_runs_serves_and_stops_on_sigterm(self) -> None:
        tag = await deferToThread(container.image)
        port = free_port()
        name = f"mrunner-test-{port}"
        # The host's network: the daemon's own listen address is the test's to choose.
        await self.podman(
            *("run", "-d", "--name", name, "--network=host", *container.LIMITS),
            *("-e", f"MRUNNER_LISTEN=tcp:{port}:interface=127.0.0.1", "-e", f"MRUNNER_API_KEY={KEY}", tag),
        )
        self.addCleanup(lambda: self.podman("rm", "-f", name, check=False))
        url = f"http://127.0.0.1:{port}"
        health: list[Any] = []
        await eventually(lambda: self.poll(url + "/health", health), seconds=120, what=lambda: str(health))
        self.assertEqual(health[-1], {"status": "ok"})

        # The image's own llama-server answers the official client, behind the key.
        model = Path(self.mktemp())
        write_tiny_llama(model)
        headers = {"Authorization": f"Bearer {KEY}"}
        loaded = await treq.post(
            url + "/models/load",
            params={"name": "ai/tiny"},
            data=model.read_bytes(),
            headers=headers,
            persistent=False,
        )
        self.assertEqual(loaded.code, 201, await loaded.text())
        answer = await deferToThread(self.chat, url)
        self.assertEqual(answer.model, "ai/tiny:latest")
        self.assertEqual(answer.usage.completion_tokens, 4)
        status = await (await treq.get(url + "/engines/ps", headers=headers, persistent=False)).json()
        self.assertIn("ai/tiny", json.dumps(status))

        # podman stop sends SIGTERM: the daemon stops its runner and exits 0, before any SIGKILL.
        await self.podman("stop", "-t", "120", name)
        code = (await self.podman("inspect", "--format", "{{.State.ExitCode}}", name)).stdout.strip()
        self.assertEqual(code, "0")

    async def test_pushes_to_a_registry(self) -> None:
        tag = await deferToThread(container.image)
        directory = Path(self.mktemp())
        registry = registry_server.RealRegistry(directory)
        await registry.start()
        self.addCleanup(lambda: ensureDeferred(registry.stop()))
        await self.podman("push", "--tls-verify=false", tag, f"{registry.host}/team/mrunner:v1", timeout=1800)

        base = f"http://{registry.host}/v2/team/mrunner"
        self.assertEqual(
            (await (await treq.get(base + "/tags/list", persistent=False)).json())["tags"], ["v1"]
        )
        manifest = await (
            await treq.get(base + "/manifests/v1", headers={"Accept": OCI_MANIFEST}, persistent=False)
        ).json()
        config = await (
            await treq.get(f"{base}/blobs/{manifest['config']['digest']}", persistent=False)
        ).json()
        self.assertEqual(config["config"]["Entrypoint"], ["twistd", "-n", "--pidfile=", "mrunner"])
        self.assertIn("12434/tcp", config["config"]["ExposedPorts"])
        for layer in manifest["layers"]:
            head = await treq.head(f"{base}/blobs/{layer['digest']}", persistent=False)
            self.assertEqual(
                (head.code, head.headers.getRawHeaders("content-length")), (200, [str(layer["size"])])
            )

    def podman(self, *args: str, timeout: float = 600, check: bool = True) -> Any:
        return deferToThread(container.podman, *args, timeout=timeout, check=check)

    @staticmethod
    def poll(url: str, seen: list[Any]) -> bool:
        """One GET of C{url} (refused at once until the daemon listens); its JSON or error into C{seen}."""
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                seen.append(json.load(response))
                return True
        except OSError as e:
            seen.append(repr(e))
            return False

    @staticmethod
    def chat(url: str) -> Any:
        client = OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
        return client.chat.completions.create(
            model="ai/tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=0
        )
