"""/openapi.json: served, and holding exactly the routes the Klein URL maps have."""

from __future__ import annotations

import json
from pathlib import Path

import schemathesis
from treq.testing import StubTreq
from twisted.internet.testing import MemoryReactorClock
from twisted.trial.unittest import SynchronousTestCase

from mrunner import config as configuration
from mrunner.api.manage.openapi import OpenAPI, described, routed
from mrunner.tap import make_parts


class OpenAPITests(SynchronousTestCase):
    def setUp(self) -> None:
        home = Path(self.mktemp())
        config = configuration.load(None, overrides={"home": str(home)}, environ={})
        self.root = make_parts(config, MemoryReactorClock()).site.resource
        self.document = next(group for group in self.root.groups if isinstance(group, OpenAPI)).document

    def test_every_route_is_documented_and_nothing_else(self) -> None:
        served = set().union(*(routed(group) for group in self.root.groups))
        documented = described(self.document)
        self.assertEqual(served - documented, set(), "routes the document lacks")
        self.assertEqual(documented - served, set(), "documented operations no route serves")
        self.assertIn(("POST", "/engines/{backend}/v1/chat/completions"), served)
        self.assertIn(("DELETE", "/models/{name}"), served)
        self.assertIn(("GET", "/openapi.json"), served)

    def test_every_operation_loads(self) -> None:
        """schemathesis, which fuzzes the document in test_fuzz, reads each operation without error."""
        results = list(schemathesis.openapi.from_dict(self.document).get_all_operations())
        self.assertEqual(len(results), len(described(self.document)))
        self.assertEqual([r for r in results if type(r).__name__ != "Ok"], [])

    def test_served(self) -> None:
        http = StubTreq(self.root)
        response = self.successResultOf(http.get("http://mrunner/openapi.json"))
        body = json.loads(self.successResultOf(response.content()))
        self.assertEqual((response.code, body["openapi"]), (200, "3.1.0"))
        self.assertEqual(body, self.document)

    def test_every_operation_lists_the_front_door_answers(self) -> None:
        front_door = {"400", "401", "403", "404", "413", "503"}
        for path, operations in self.document["paths"].items():
            for operation in operations.values():
                self.assertLessEqual(front_door, set(operation["responses"]), path)

    def test_request_bodies_are_the_checks(self) -> None:
        """The chat body's schema is built from the rules that check it: the two cannot drift."""
        schema = self.document["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]
        chat = schema["application/json"]["schema"]
        self.assertEqual(chat["required"], ["model", "messages"])
        self.assertEqual(chat["properties"]["messages"]["minItems"], 1)
        role = chat["properties"]["messages"]["items"]["properties"]["role"]
        self.assertIn("assistant", role["enum"])
