"""What the tests share: a daemon to start, fakes, tiny GGUFs, a registry and a hub, a scripted runner,
and the bases of the test cases (a test module imports no other test module; `make lint` checks it)."""
