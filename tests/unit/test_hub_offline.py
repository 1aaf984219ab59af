"""An unreachable Hugging Face hub names the Hub's own way out, not a registry's (issue 36's walk)."""

from __future__ import annotations

from typing import Any, cast

from treq.client import HTTPClient
from twisted.internet.defer import Deferred, ensureDeferred, fail
from twisted.internet.error import DNSLookupError
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from mrunner.config import HuggingFaceConfig
from mrunner.errors import BadGateway
from mrunner.store.huggingface import HubClient


class NoNetwork:
    """An HTTP client on a machine without a network: every lookup fails."""

    def get(self, url: str, **kwargs: Any) -> Deferred[Any]:
        return fail(DNSLookupError("no results for hostname lookup: huggingface.co"))


class UnreachableHubTests(SynchronousTestCase):
    def test_the_hint_is_the_hubs(self) -> None:
        hub = HubClient(HuggingFaceConfig(), cast(HTTPClient, NoNetwork()), {}, Clock())
        error = self.failureResultOf(ensureDeferred(hub.revision("bartowski/SmolLM2")), BadGateway).value
        self.assertEqual(error.code, "registry_unreachable")
        self.assertIn("Hugging Face endpoint huggingface.co is unreachable", error.message)
        self.assertIn("point HF_ENDPOINT (or [huggingface] endpoint) at a hub", error.message)
        self.assertIn("`mrunner package --gguf FILE NAME`", error.message)
        self.assertNotIn("[registry] mirrors", error.message)

    def test_a_whisper_repository_is_packaged_with_whisper(self) -> None:
        """Issue 53 N7: `mrunner pull hf.co/ggerganov/whisper.cpp:base.en` offline suggested --gguf."""
        hub = HubClient(HuggingFaceConfig(), cast(HTTPClient, NoNetwork()), {}, Clock())
        error = self.failureResultOf(ensureDeferred(hub.revision("ggerganov/whisper.cpp")), BadGateway).value
        self.assertEqual(error.code, "registry_unreachable")
        self.assertIn("`mrunner package --whisper FILE NAME`", error.message)
        self.assertNotIn("--gguf", error.message)
