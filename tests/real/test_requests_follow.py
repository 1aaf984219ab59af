"""``mrunner requests --follow`` as ``tail -f``: a header, the last few records, then each new one.

It replayed the daemon's stored records (fifty) first, with no header to say what the columns were
or where the replay ended.
"""

from __future__ import annotations

from mrunner.cli.engines import FOLLOW_BACKLOG
from tests.support.cli_cases import CLITestCase
from tests.support.daemon import eventually, http

EARLIER = FOLLOW_BACKLOG + 2


class RequestsFollowTests(CLITestCase):
    async def ask(self) -> None:
        response = await http.post(
            f"{self.daemon.url}/v1/chat/completions",
            json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]},
        )
        self.assertEqual(response.code, 200, await response.text())
        await response.text()

    async def test_a_header_the_last_few_then_each_new_one(self) -> None:
        await self.daemon.import_model("tiny", self.gguf)
        for _ in range(EARLIER):
            await self.ask()
        follow = self.spawn("requests", "--follow")

        def rows() -> list[list[str]]:
            return [line.split() for line in follow.output.splitlines() if line.strip()]

        await eventually(lambda: len(rows()) > FOLLOW_BACKLOG, 10, what=lambda: follow.output)
        await self.ask()
        await eventually(lambda: len(rows()) > FOLLOW_BACKLOG + 1, 10, what=lambda: follow.output)
        assert follow.transport is not None
        follow.transport.signalProcess("INT")
        await follow.ended
        header, *records = rows()
        self.assertEqual(header[:5], ["ID", "STARTED", "MODEL", "ROUTE", "STATUS"])
        self.assertEqual(
            [int(row[0]) for row in records], list(range(EARLIER - FOLLOW_BACKLOG + 1, EARLIER + 2))
        )
        self.assertEqual({row[2] for row in records}, {"ai/tiny:latest"})
        # The columns line up under the header.
        lines = follow.output.splitlines()
        self.assertEqual(lines[0].index("MODEL"), lines[1].index("ai/tiny:latest"))
