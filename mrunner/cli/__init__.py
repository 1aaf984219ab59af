"""``mrunner``: the command line, a client of the daemon's HTTP API and nothing else."""
