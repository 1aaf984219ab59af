"""The installer: one shared install per backend, statuses, failures retried by the next wait."""

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from mrunner.errors import NotFound, Unavailable
from mrunner.moves import IllegalMove
from mrunner.scheduling.installer import INSTALL_MOVES, Installer, _Install
from mrunner.values import InstallState, InstallStatus
from tests.support.fakes import FakeBackend
from tests.support.moves import pairs


class InstallerTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.backend = FakeBackend()
        self.installer = Installer({"llama.cpp": self.backend}, self.clock)

    def test_statuses(self) -> None:
        self.assertEqual(self.installer.statuses(), {"llama.cpp": InstallStatus()})
        self.installer.start("llama.cpp")
        self.assertEqual(self.installer.statuses(), {"llama.cpp": InstallStatus(InstallState.INSTALLING)})
        self.backend.reports[0]("compiling 12/410")
        self.assertEqual(
            self.installer.statuses(),
            {"llama.cpp": InstallStatus(InstallState.INSTALLING, "compiling 12/410")},
        )
        self.backend.installs[0].callback("llama.cpp 0c1e570")
        self.assertEqual(
            self.installer.statuses(), {"llama.cpp": InstallStatus(InstallState.RUNNING, "llama.cpp 0c1e570")}
        )

    def test_waiters_share_one_install(self) -> None:
        self.installer.start("llama.cpp")
        waiters = [self.installer.wait("llama.cpp", 10) for _ in range(5)]
        self.assertEqual(len(self.backend.installs), 1)
        self.backend.installs[0].callback("v1")
        for d in waiters:
            self.successResultOf(d)
        self.successResultOf(self.installer.wait("llama.cpp", 10))

    def test_slow_install_is_503_with_retry_after(self) -> None:
        self.installer.start("llama.cpp")
        self.backend.reports[0]("compiling 1/2")
        d = self.installer.wait("llama.cpp", 5)
        self.clock.advance(5)
        error = self.failureResultOf(d, Unavailable).value
        self.assertIn("compiling 1/2", error.message)
        self.assertIsNotNone(error.retry_after)
        self.backend.installs[0].callback("v1")
        self.assertIs(self.installer.statuses()["llama.cpp"].state, InstallState.RUNNING)

    def test_failure_is_reported_and_retried(self) -> None:
        self.installer.start("llama.cpp")
        d = self.installer.wait("llama.cpp", 10)
        self.backend.installs[0].errback(FileNotFoundError("no llama-server at /nope"))
        self.assertIn("/nope", self.failureResultOf(d, Unavailable).value.message)
        self.assertEqual(
            self.installer.statuses()["llama.cpp"],
            InstallStatus(InstallState.ERROR, "no llama-server at /nope"),
        )
        retry = self.installer.wait("llama.cpp", 10)
        self.assertEqual(len(self.backend.installs), 2)
        self.backend.installs[1].callback("v2")
        self.successResultOf(retry)

    def test_unknown_backend(self) -> None:
        self.failureResultOf(self.installer.wait("vllm", 1), NotFound)

    def test_a_report_after_the_install_changes_nothing(self) -> None:
        self.installer.start("llama.cpp")
        self.backend.installs[0].callback("v1")
        self.backend.reports[0]("compiling 2/2")
        self.assertEqual(self.installer.statuses()["llama.cpp"], InstallStatus(InstallState.RUNNING, "v1"))


class InstallMovesTests(SynchronousTestCase):
    """An install's status moves only as its table says; every other move is refused and changes nothing."""

    def test_every_move(self) -> None:
        allowed = {
            (InstallState.NOT_INSTALLED, InstallState.INSTALLING),
            (InstallState.INSTALLING, InstallState.INSTALLING),
            (InstallState.INSTALLING, InstallState.RUNNING),
            (InstallState.INSTALLING, InstallState.ERROR),
            (InstallState.ERROR, InstallState.INSTALLING),
        }
        for now in InstallState:
            for to in InstallState:
                install = _Install(FakeBackend(), InstallStatus(now, "before"))
                if (now, to) in allowed:
                    install.move(to, "after")
                    self.assertEqual(install.status, InstallStatus(to, "after"))
                else:
                    self.assertRaises(IllegalMove, install.move, to, "after")
                    self.assertEqual(install.status, InstallStatus(now, "before"), (now, to))
        self.assertEqual(pairs(INSTALL_MOVES), allowed)
