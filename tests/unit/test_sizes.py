"""tools/sizes.py, the size check of ``make lint``: planted long modules and functions are caught."""

from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from tools import sizes


def function(name: str, lines: int) -> str:
    """Source of a function C{lines} long in all (its C{def} line included)."""
    return f"def {name}():\n" + "    x = 1\n" * (lines - 1)


class SizesTests(SynchronousTestCase):
    def check(self, files: dict[str, str], allowed: str = "") -> list[str]:
        """The problems found in C{files} planted under mrunner/ of a fresh tree."""
        root = Path(self.mktemp())
        (root / "mrunner").mkdir(parents=True)
        for name, source in files.items():
            (root / "mrunner" / name).write_text(source)
        return sizes.problems(root, sizes.allowed(allowed))

    def test_within_limits_passes(self) -> None:
        source = function("f", 60) + "\n" * (400 - 60)
        self.assertEqual(self.check({"m.py": source}), [])

    def test_long_module_caught(self) -> None:
        [problem] = self.check({"m.py": "x = 1\n" * 401})
        self.assertIn("mrunner/m.py: 401 lines, over 400", problem)

    def test_long_function_caught_top_level_method_or_async(self) -> None:
        method = "class C:\n" + "\n".join("    " + line for line in function("method", 61).splitlines())
        source = function("top", 61) + "\n" + method + "\n\nasync " + function("waits", 62)
        self.assertEqual(
            [problem.partition(",")[0] for problem in self.check({"m.py": source})],
            ["mrunner/m.py:top: 61 lines", "mrunner/m.py:method: 61 lines", "mrunner/m.py:waits: 62 lines"],
        )

    def test_c_and_javascript_read_for_their_module_size_alone(self) -> None:
        """A long C or JavaScript file is caught; its functions are not measured (no parser)."""
        long_function = "int f(void) {\n" + "    x++;\n" * 70 + "}\n"
        files = {"loop.c": "int x;\n" * 401, "page.js": "let x;\n" * 401, "short.c": long_function}
        self.assertEqual(
            [problem.partition(",")[0] for problem in self.check(files)],
            ["mrunner/loop.c: 401 lines", "mrunner/page.js: 401 lines"],
        )

    def test_allow_list_names_module_or_function(self) -> None:
        files = {"a.py": "x = 1\n" * 401, "b.py": function("long", 61) + function("other", 61)}
        problems = self.check(files, "mrunner/a.py  # being split\nmrunner/b.py:long  # being split\n")
        self.assertEqual(
            [problem.partition(",")[0] for problem in problems], ["mrunner/b.py:other: 61 lines"]
        )

    def test_an_entry_without_a_reason_is_refused(self) -> None:
        with self.assertRaises(ValueError) as caught:
            sizes.allowed("# header\na.py\n")
        self.assertIn("a.py gives no reason", str(caught.exception))

    def test_the_tree_passes_with_its_allow_list(self) -> None:
        """The repository itself, as ``make lint`` runs it from the root."""
        root = Path(__file__).parents[2]
        self.assertEqual(sizes.problems(root, sizes.allowed(sizes.ALLOWED.read_text())), [])
