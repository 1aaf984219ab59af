"""mrunner tests; run with ``python -m twisted.trial tests``.

Hypothesis's property tests run with no deadline and no "too slow" health check:
a verdict must not depend on how busy the machine is (CI runs on machines of
different speeds), and what they check is behaviour, never time.
"""

from hypothesis import HealthCheck, settings

settings.register_profile("mrunner", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("mrunner")
