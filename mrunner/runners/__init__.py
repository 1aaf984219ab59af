"""A runner's life: its process, its one machine, its record, what it holds and its checks, a module a job.

- L{process}: its child process (started by the scheduler with the backend's command line), its log;
- L{lifecycle}: its machine, every stage, input, output and timer in one table;
- L{runner}: the machine's core, L{runner.Runner}: the outputs, and the views the loader reads;
- L{holding}: what it holds in memory, as the budget counts it;
- L{request}: what a runner is started for (L{request.LoadRequest});
- L{checks}: mrunner's own GETs (C{/health} while a runner loads, C{/metrics} scrapes), sent by
  whatever requester it is given (the proxy's pool);
- L{metrics}: its own Prometheus metrics, read when the daemon's are.

The HTTP client that talks to a runner, and relays its answers to clients, is L{mrunner.proxy}; the
two never import each other. Nothing here knows the API layer or scheduling (the loader drives a
runner by its machine's inputs).
"""
