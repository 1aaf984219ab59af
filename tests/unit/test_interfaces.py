"""Each implementation provides the interface it claims."""

from pathlib import Path

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from zope.interface.verify import verifyClass, verifyObject

from mrunner.backends.command import CommandBackend
from mrunner.config import Config
from mrunner.interfaces import (
    IBackend,
    IDevices,
    IModelPuller,
    IModelPusher,
    IModelStore,
    IProgress,
    IRunnerProcess,
    IScheduler,
    IUpload,
)
from mrunner.scheduling.facade import Scheduler
from mrunner.store.progress import Progress
from mrunner.store.pull import Puller
from mrunner.store.push import Pusher
from mrunner.store.upload import Upload
from tests.support.fakes import FakeBackend, FakeDeviceBudgets, FakeProcess, FakeSpawner, FakeStore


class InterfaceTests(SynchronousTestCase):
    def test_scheduler(self) -> None:
        scheduler = Scheduler(
            Clock(),
            Config(home=Path(self.mktemp())),
            {"llama.cpp": FakeBackend()},
            FakeStore(),
            FakeSpawner().start_runner,
        )
        self.assertTrue(verifyObject(IScheduler, scheduler))

    def test_command_backend(self) -> None:
        self.assertTrue(verifyObject(IBackend, CommandBackend("custom", ["python3", "server.py"])))

    def test_pull_and_push(self) -> None:
        """The model routes take the puller and the pusher as these interfaces (the store: test_store)."""
        self.assertTrue(verifyClass(IModelPuller, Puller))
        self.assertTrue(verifyClass(IModelPusher, Pusher))

    def test_progress_and_upload(self) -> None:
        """The seams name a pull's progress and an import's staged files by these, the store makes them."""
        self.assertTrue(verifyObject(IProgress, Progress(lambda line: None, Clock(), "pull")))
        self.assertTrue(verifyClass(IUpload, Upload))

    def test_fakes_keep_to_the_interfaces(self) -> None:
        self.assertTrue(verifyObject(IBackend, FakeBackend()))
        self.assertTrue(verifyObject(IModelStore, FakeStore()))
        self.assertTrue(verifyObject(IRunnerProcess, FakeProcess("/run/r.sock")))
        self.assertTrue(verifyObject(IDevices, FakeDeviceBudgets({"CUDA0": 1})))
