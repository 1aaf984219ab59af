"""Benchmarks of mrunner against baselines measured in the same run.

"Speed is measured, not asserted": every number mrunner gets is printed next
to the same workload sent straight to ``llama-server`` and through nginx (the
reference reverse proxy) in front of that same ``llama-server``, with the same
client code, so the ratios show what mrunner itself costs. ``python -m bench``
(or ``make bench``) runs it; see ``bench/__main__.py``.
"""
