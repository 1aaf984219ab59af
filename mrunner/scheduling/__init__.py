"""Scheduling: install backends, load runners, share and evict them. No HTTP parsing here.

The policy decides (L{policy.plan}, pure), the loader applies its plans, each
runner's life is one machine (L{lifecycle}: states, inputs and outputs in one
table) acting on the loader's record of it (L{roster}), its process is one
child (L{process}), and the API sees only snapshot values and leases through
L{mrunner.interfaces.IScheduler}. The smaller lifecycles (an install, a
preload, a process's readiness) move only as their tables in L{moves} allow.
"""
