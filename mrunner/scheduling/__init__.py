"""Scheduling: install backends, load runners, share and evict them. No HTTP parsing here.

The policy decides (L{policy.plan}, pure), the loader applies its plans, each
runner's life is one machine (L{lifecycle}), its process one child
(L{runner}), and the API sees only L{snapshot} values and leases through
L{mrunner.interfaces.IScheduler}.
"""
