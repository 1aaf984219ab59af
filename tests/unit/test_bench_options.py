"""``python -m bench --help`` describes every knob: each Settings field's option has its text and default."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os

from twisted.trial.unittest import SynchronousTestCase

from bench.__main__ import parse
from bench.settings import Settings


class BenchOptionsTests(SynchronousTestCase):
    def test_every_knob_is_described(self) -> None:
        self.patch(os, "environ", {**os.environ, "COLUMNS": "1000"})  # argparse wraps at this width
        shown = io.StringIO()
        with contextlib.redirect_stdout(shown), self.assertRaises(SystemExit):
            parse(["--help"])
        text = " ".join(shown.getvalue().split())
        for field in dataclasses.fields(Settings):
            option = "--" + field.name.replace("_", "-")
            described = f"{option} {field.name.upper()} {field.metadata['help']} [default: {field.default}]"
            self.assertIn(described, text)

    def test_the_options_set_the_settings(self) -> None:
        args = parse(["--soak-ramp", "0.5", "--rounds", "2"])
        self.assertEqual((args.soak_ramp, args.rounds, args.threads), (0.5, 2, Settings().threads))
