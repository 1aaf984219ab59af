"""``python -m mrunner.cli``, the same as the ``mrunner`` console script."""

from mrunner.cli.main import main

main()
