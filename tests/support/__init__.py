"""What the tests share: a daemon to start, fakes, tiny GGUFs, a registry and a hub, a scripted runner."""
