"""Scheduling: install backends, load runners, share and evict them. No HTTP parsing here.

The policy decides (L{policy.plan}, pure), the loader applies its plans and
keeps its runners in a L{roster}; each runner's life is one machine in
L{mrunner.runners} (L{mrunner.runners.lifecycle}), which the loader sends
inputs and whose states it reads. The API sees only snapshot values and
leases through L{mrunner.interfaces.IScheduler}. The smaller lifecycles (an
install, a preload) move only as their tables in L{mrunner.moves} allow.
"""
