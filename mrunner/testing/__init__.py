"""Support for tests of mrunner and of what is built on it, shipped in the package (as C{treq.testing}).

The tests and the bench make their models here; the daemon never imports it."""
