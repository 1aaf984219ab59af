"""The project's own dev checks, run by ``make lint``; not installed with mrunner."""
