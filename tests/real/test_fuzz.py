"""The published contract, fuzzed: schemathesis against a real daemon, real llama-server, tiny model.

Every operation in /openapi.json gets generated requests (examples, boundary
coverage, random fuzzing; valid and invalid). The run passes only with no 5xx,
no crash (trial fails a test whose daemon logs an unhandled error), and every
answer matching the document. Its summary is printed into the CI log, quoted so that no
line of it reads as a test runner's verdict: CI takes the log's closing lines for one, and
schemathesis ends with pytest's banner (C{===== 2 warnings in 17.32s =====}).
"""

from __future__ import annotations

import json
import os
import re
import sys
from functools import partial
from pathlib import Path

from twisted.internet.utils import getProcessOutputAndValue
from twisted.trial.unittest import SynchronousTestCase

from mrunner.testing.tinymodel import write_tiny_llama
from tests.support.daemon import http
from tests.support.llamacpp_cases import TINY, LlamaCppTestCase
from tests.support.registry_server import SKIP, RealRegistry

ST = str(Path(sys.executable).with_name("st"))
CHECKS = ",".join(
    (
        "not_a_server_error",
        "status_code_conformance",
        "content_type_conformance",
        "response_headers_conformance",
        "response_schema_conformance",
        "negative_data_rejection",
    )
)
EXAMPLES_PER_OPERATION = 8
# CI runs a few hundred cases; MRUNNER_FUZZ_PHASES=examples,coverage,fuzzing adds schemathesis's
# boundary cases (thousands, a few minutes) for a deeper look.
PHASES = os.environ.get("MRUNNER_FUZZ_PHASES", "examples,fuzzing")
CONFIGURED = "ai/configured:latest"  # _configure restarts runners: it gets a model of its own
# A banner's rule of "=" (or "_", "-"), and a count followed by an outcome ("523 passed").
RULE = re.compile(r"^[=_-]{3,}\s*|\s*[=_-]{3,}$")
COUNT = re.compile(r"\b(\d+) (passed|failed|skipped|errors?|warnings?|xfailed|xpassed|deselected)\b")
QUOTE = "    schemathesis | "


def quoted(summary: str) -> str:
    """C{summary} as the CI log shows it: indented, banners' rules dropped, "523 passed" as "passed: 523".

    What is left cannot be taken for a test runner's closing line (pytest's banner, "N passed").
    """
    lines = (COUNT.sub(r"\2: \1", RULE.sub("", line.rstrip())) for line in summary.splitlines())
    return "".join(f"{QUOTE}{line}\n" for line in lines if line)


class SchemathesisTests(LlamaCppTestCase):
    timeout = 240
    skip = SKIP

    async def test_contract(self) -> None:
        registry = RealRegistry(Path(self.mktemp()))
        await registry.start()
        self.addCleanup(registry.stop)
        await self.start(f'[registry]\ndefault = "{registry.host}"\n')
        await self.tiny()
        await self.tiny(CONFIGURED, partial(write_tiny_llama, seed=1))  # another digest
        models = json.loads(await (await http.get(self.daemon.url + "/models")).text())
        env = {
            **os.environ,
            "SCHEMATHESIS_HOOKS": "tests.support.fuzz_hooks",
            "MRUNNER_FUZZ_MODEL": TINY,
            "MRUNNER_FUZZ_CONFIGURED": CONFIGURED,
            "MRUNNER_FUZZ_KEEP": ",".join(name for model in models for name in (model["id"], *model["tags"])),
            "PYTHONPATH": str(Path(__file__).parents[2]),
        }
        args = [
            *("run", self.daemon.url + "/openapi.json"),
            *("--checks", CHECKS),
            *("--max-examples", str(EXAMPLES_PER_OPERATION)),
            *("--phases", PHASES),
            *("--seed", "1", "--generation-deterministic"),
            *("--workers", "2", "--request-timeout", "60", "--no-color"),
            *("--suppress-health-check", "all"),
            # A drained daemon answers every inference request 503 by design (tests/unit/test_drain,
            # tests/real/test_cluster_real): the fuzz run leaves POST /engines/_drain alone.
            *("--exclude-path", "/engines/_drain"),
            *("--report-dir", self.mktemp()),
        ]
        out, err, code = await getProcessOutputAndValue(ST, args, env=env, path=str(self.home))
        summary = (out + err).decode(errors="replace")
        sys.__stdout__.write(f"\n--- schemathesis against mrunner ---\n{quoted(summary)}")
        self.assertEqual(code, 0, "schemathesis found failures: see its summary above")


class QuotedTests(SynchronousTestCase):
    """The fuzz summary in the CI log holds no line a CI reads as a test runner's verdict."""

    SUMMARY = (
        "======================= Summary =======================\n"
        "Test cases: 523 generated, 523 passed, 1 failed, 2 skipped\n"
        "\n"
        "============= 2 warnings in 17.32s =============\n"
    )

    def test_no_verdict(self) -> None:
        log = quoted(self.SUMMARY)
        for line in log.splitlines():
            self.assertTrue(line.startswith(QUOTE), line)
            self.assertNotRegex(line, r"=+ .* in [0-9.]+s =+")
            self.assertNotRegex(line, r"\b\d+ (passed|failed|skipped|warnings?)\b")

    def test_keeps_what_matters(self) -> None:
        self.assertEqual(
            quoted(self.SUMMARY).splitlines(),
            [
                QUOTE + "Summary",
                QUOTE + "Test cases: 523 generated, passed: 523, failed: 1, skipped: 2",
                QUOTE + "warnings: 2 in 17.32s",
            ],
        )
