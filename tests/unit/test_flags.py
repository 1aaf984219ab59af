"""The _configure flag allow-list, value by value, against what the pinned llama-server accepts."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from mrunner.api.manage.flags import MAX_THREADS, runtime_flags
from mrunner.errors import BadRequest


class RuntimeFlagTests(SynchronousTestCase):
    def test_allowed(self) -> None:
        for flags, expected in [
            ("--temp 0.2 --top-k 5", ("--temp", "0.2", "--top-k", "5")),
            (["--seed", "-1", "-cb"], ("--seed", "-1", "-cb")),
            (["--cache-type-k", "q8_0", "-fa", "on"], ("--cache-type-k", "q8_0", "-fa", "on")),
            (["-ngl", "all", "--n-predict", "-1", "--threads", str(MAX_THREADS)], None),
            (["--rope-scaling", "yarn", "--reasoning-format", "deepseek-legacy", "--min-p", "0.05"], None),
            ([], ()),
        ]:
            self.assertEqual(runtime_flags(flags), expected or tuple(flags), flags)

    def test_refused(self) -> None:
        for flags, words in [
            (["--model", "x.gguf"], "'--model' is not allowed"),
            ("--temp 0.2 --lora /tmp/a", "'--lora' is not allowed"),
            (["--host=0.0.0.0"], "'--host' is not allowed"),
            (["--mlock"], "'--mlock' is not allowed"),
            (["--no-mmap"], "'--no-mmap' is not allowed"),
            (["--temp=0.5"], "no --temp=VALUE form"),
            (["--temp", "0.5", "foo"], "'foo' is not a flag"),
            (["--threads", "100000"], f"from -1 to {MAX_THREADS}"),
            (["--temp"], "takes a value"),
            (["--temp", "nan"], "takes a number"),
            (["--temp", "-1"], "at least 0"),
            (["--top-p", "1.5"], "at most 1"),
            (["--repeat-penalty", "0"], "above 0"),
            (["--top-k", "²"], "an integer"),
            (["--top-k", "99999999999"], "an integer"),
            (["--top-k", "1" * 5000], "an integer"),  # int() refuses it: a ValueError's 500 (issue 22)
            (["--cache-type-k", "/etc/passwd"], "one of f32"),
            (["-fa", "maybe"], "one of on"),
            (["--temp", "0.2 --model x"], "takes a number"),
            (["0.2"], "is not a flag"),
            ([1, 2], "list of strings"),
        ]:
            error = self.assertRaises(BadRequest, runtime_flags, flags)
            self.assertIn(words, error.message, flags)
            self.assertEqual((error.status, error.param), (400, "runtime_flags"))
