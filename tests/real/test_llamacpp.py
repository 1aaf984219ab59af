"""The llama.cpp backend without real processes: a fake reactor records every child it spawns."""

from __future__ import annotations

import fcntl
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import attrs
from twisted.internet.defer import CancelledError, Deferred
from twisted.trial.unittest import SynchronousTestCase
from zope.interface.verify import verifyObject

from mrunner.backends import build, childprocess
from mrunner.backends.build import cache_root
from mrunner.backends.llamacpp import source
from mrunner.backends.llamacpp.backend import LlamaCppBackend
from mrunner.backends.llamacpp.sizing import BASE_RSS, context_size, memory_estimate
from mrunner.config import CacheConfig
from mrunner.errors import BadRequest
from mrunner.interfaces import IBackend
from mrunner.values.backend import COMPLETION, EMBEDDING, RERANKING, RunnerSettings
from mrunner.values.model import Model
from tests.support.llamacpp_fixture import VERSION_OUTPUT, FakeChild, FakeProcessReactor, Fixture, executable

NO_DEVICES = b"Available devices:\n  (none)\n"


def model(config: dict[str, Any] | None = None) -> Model:
    return Model(
        id="sha256:" + "ab" * 32,
        tags=("ai/tiny:latest",),
        created=0,
        config=config or {},
        gguf="/models/blobs/sha256/abab",
    )


class InstallTests(SynchronousTestCase):
    def test_interface(self) -> None:
        verifyObject(IBackend, Fixture(self).backend)

    def test_configured_path_missing(self) -> None:
        fixture = Fixture(self, path="/x/y/llama-server")
        failure = self.failureResultOf(fixture.install(), build.InstallFailed)
        self.assertEqual(
            failure.getErrorMessage(),
            "llama-server not found at /x/y/llama-server: configured path does not exist",
        )
        self.assertEqual(fixture.reactor.children, [])

    def test_configured_path_wins(self) -> None:
        """A configured executable is used even when PATH has one, after `--version` works."""
        configured = executable(Path(self.mktemp()) / "llama-server")
        fixture = Fixture(self, path=str(configured))
        executable(fixture.bin / "llama-server")
        installing = fixture.install()
        probe = fixture.reactor.next("llama-server")
        self.assertEqual(probe.argv, (str(configured), "--version"))
        probe.finish(0, stderr=VERSION_OUTPUT)
        listing = fixture.reactor.next("llama-server")
        self.assertEqual(listing.argv, (str(configured), "--list-devices"))
        listing.finish(0, stdout=NO_DEVICES)
        self.assertEqual(self.successResultOf(installing), "llama.cpp 0c1e570")
        self.assertEqual(fixture.backend.executable, configured)
        self.assertEqual(len(fixture.reactor.children), 2)

    def test_configured_path_does_not_run(self) -> None:
        configured = executable(Path(self.mktemp()) / "llama-server")
        fixture = Fixture(self, path=str(configured))
        installing = fixture.install()
        fixture.reactor.next("llama-server").finish(126, stderr=b"cannot execute binary file\n")
        message = self.failureResultOf(installing, build.InstallFailed).getErrorMessage()
        self.assertIn(f"llama-server at {configured} does not run", message)
        self.assertIn("cannot execute binary file", message)

    def test_probe_timeout(self) -> None:
        configured = executable(Path(self.mktemp()) / "llama-server")
        fixture = Fixture(self, path=str(configured))
        installing = fixture.install()
        probe = fixture.reactor.next("llama-server")
        fixture.reactor.advance(30)
        self.assertEqual(probe.signals, ["TERM"])
        probe.finish(143)
        message = self.failureResultOf(installing, build.InstallFailed).getErrorMessage()
        self.assertIn("took over 30s", message)
        self.assertEqual(fixture.reactor.getDelayedCalls(), [])

    def test_search_order(self) -> None:
        """PATH, then $MRUNNER_HOME, then the shared cache; each that fails is skipped."""
        fixture = Fixture(self)
        candidates = [
            executable(fixture.bin / "llama-server"),
            executable(fixture.pinned(fixture.home) / "bin" / "llama-server"),
            executable(fixture.pinned(fixture.cache) / "bin" / "llama-server"),
        ]
        installing = fixture.install()
        for candidate in candidates:
            probe = fixture.reactor.next("llama-server")
            self.assertEqual(probe.argv, (str(candidate), "--version"))
            probe.finish(1, stderr=b"error while loading shared libraries\n")
        # Nothing worked: build (to replace the broken cached build).
        fixture.reactor.next(os.path.basename(sys.executable)).finish(1, stderr=b"offline\n")
        fixture.reactor.next("rm").finish(0)
        message = self.failureResultOf(installing, build.InstallFailed).getErrorMessage()
        self.assertIn("failed while downloading llama-cpp-python", message)
        self.assertIn("offline", message)

    def test_earlier_build_found(self) -> None:
        fixture = Fixture(self)
        home_build = executable(fixture.pinned(fixture.home) / "bin" / "llama-server")
        installing = fixture.install()
        fixture.reactor.next("llama-server").finish(0, stderr=VERSION_OUTPUT)
        self.assertEqual(self.successResultOf(installing), "llama.cpp 0c1e570")
        self.assertEqual(fixture.backend.executable, home_build)
        self.assertEqual(fixture.reports, ["looking for llama-server"])

    def test_unparsable_version(self) -> None:
        fixture = Fixture(self)
        executable(fixture.bin / "llama-server")
        installing = fixture.install()
        fixture.reactor.next("llama-server").finish(0, stderr=b"version: 0 (unknown)\n")
        fixture.reactor.next("llama-server").finish(0, stdout=NO_DEVICES)
        self.assertEqual(self.successResultOf(installing), "llama.cpp (unknown version)")

    def test_uninstall_removes_only_our_build(self) -> None:
        fixture = Fixture(self)
        executable(fixture.pinned(fixture.cache) / "bin" / "llama-server")
        installing = fixture.install()
        fixture.reactor.next("llama-server").finish(0, stderr=VERSION_OUTPUT)
        self.successResultOf(installing)
        self.assertEqual(fixture.backend.disk_usage(), len("#!/bin/sh\n"))

        uninstalling = fixture.backend.uninstall()
        self.assertFalse(fixture.pinned(fixture.cache).exists())
        remove = fixture.reactor.next("rm")
        self.assertIn(".trash-", remove.argv[-1])
        remove.finish(0)
        self.successResultOf(uninstalling)
        self.assertIsNone(fixture.backend.executable)

    def test_external_executable_not_ours(self) -> None:
        fixture = Fixture(self)
        on_path = executable(fixture.bin / "llama-server")
        installing = fixture.install()
        fixture.reactor.next("llama-server").finish(0, stderr=VERSION_OUTPUT)
        fixture.reactor.next("llama-server").finish(0, stdout=NO_DEVICES)
        self.successResultOf(installing)
        self.assertEqual(fixture.backend.disk_usage(), 0)
        self.successResultOf(fixture.backend.uninstall())
        self.assertTrue(on_path.exists())


class BuildTests(SynchronousTestCase):
    """The build chain: the test completes each fake step with the real one's effects."""

    def setUp(self) -> None:
        self.fixture = Fixture(self)
        self.reactor = self.fixture.reactor
        self.dest = self.fixture.pinned(self.fixture.cache)

    def work(self) -> Path:
        (work,) = self.dest.parent.glob(f".{source.PIN}.build-*")
        return work

    def start(self) -> Deferred[str]:
        installing = self.fixture.install()
        pip = self.reactor.next(os.path.basename(sys.executable))
        self.assertEqual(
            pip.argv[1:],
            (
                *("-m", "pip", "download", "--no-deps", "--no-binary", "llama-cpp-python"),
                *("--no-input", "--disable-pip-version-check"),
                *("llama-cpp-python==0.3.36", "-d", str(self.work())),
            ),
        )
        assert pip.env is not None
        tools = self.fixture.bin
        self.assertEqual(pip.env["CMAKE_EXECUTABLE"], str(tools / "cmake"), "the backend asks for no cmake")
        self.assertEqual(pip.env["CMAKE_MAKE_PROGRAM"], str(tools / "ninja"), "nor ninja")
        (self.work() / "llama_cpp_python-0.3.36.tar.gz").write_bytes(b"sdist")
        pip.finish(0)
        tar = self.reactor.next("tar")
        self.assertEqual(tar.argv[-1], "llama_cpp_python-0.3.36/vendor/llama.cpp")
        tar.finish(0)
        cmake = self.reactor.next("cmake")
        self.assertEqual(cmake.argv[5:8], ("-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={tools / 'ninja'}"))
        self.assertEqual(cmake.argv[8:], source.CMAKE_FLAGS)
        assert cmake.env is not None
        self.assertEqual(cmake.env["GIT_CEILING_DIRECTORIES"], str(self.work()))
        cmake.finish(0)
        return installing

    def compile(self, lines: bytes = b"") -> FakeChild:
        ninja = self.reactor.next("ninja")
        self.assertEqual(ninja.argv[1:3], ("-C", str(self.work() / "build")))
        self.assertEqual(ninja.argv[-1], "llama-server")
        if lines:
            ninja.protocol.childDataReceived(1, lines)
        return ninja

    def remove_work(self) -> None:
        work = self.work()
        rm = self.reactor.next("rm")
        self.assertEqual(rm.argv, ("rm", "-rf", "--", str(work)))
        shutil.rmtree(work)
        rm.finish(0)

    def test_build(self) -> None:
        installing = self.start()
        ninja = self.compile(b"[1/206] Building C object ggml.c.o\n[2/206] Building")
        self.reactor.advance(0.5)
        ninja.protocol.childDataReceived(1, b" x\n[3/206] y\n")
        self.reactor.advance(1)
        ninja.protocol.childDataReceived(1, b"[4/206] z\n[206/206] Linking llama-server\n")
        executable(self.work() / "build" / "bin" / "llama-server")
        ninja.finish(0)
        verify = self.reactor.next("llama-server")
        self.assertEqual(verify.argv, (str(self.work() / "install/bin/llama-server"), "--version"))
        verify.finish(0, stderr=VERSION_OUTPUT)
        self.assertTrue((self.dest / "bin" / "llama-server").is_file())
        self.remove_work()
        probe = self.reactor.next("llama-server")
        self.assertEqual(probe.argv, (str(self.dest / "bin/llama-server"), "--version"))
        probe.finish(0, stderr=VERSION_OUTPUT)

        self.assertEqual(self.successResultOf(installing), "llama.cpp 0c1e570")
        self.assertEqual(self.fixture.backend.executable, self.dest / "bin" / "llama-server")
        self.assertEqual(
            self.fixture.reports,
            [
                *("looking for llama-server", "downloading source", "extracting source"),
                *("configuring", "compiling", "compiling 1/206", "compiling 4/206"),
                *("compiling 206/206", "verifying build"),
            ],
        )
        self.assertEqual(sorted(p.name for p in self.dest.parent.iterdir()), ["0c1e570", "0c1e570.lock"])

    def test_failure_quotes_log_and_cleans_up(self) -> None:
        installing = self.start()
        ninja = self.compile(b"[7/206] Building CXX object llama.cpp.o\n")
        ninja.finish(1, stdout=b"llama.cpp:1:1: error: expected ';'\nninja: build stopped\n")
        self.remove_work()
        message = self.failureResultOf(installing, build.InstallFailed).getErrorMessage()
        self.assertTrue(message.startswith("building llama.cpp 0c1e570 failed while compiling: ninja exited"))
        self.assertIn("error: expected ';'", message)
        self.assertIn("ninja: build stopped", message)
        self.assertFalse(self.dest.exists())

    def test_cancel_stops_build_then_cleans_up(self) -> None:
        installing = self.start()
        ninja = self.compile()
        installing.cancel()
        self.assertEqual(ninja.signals, ["TERM"])
        self.assertNoResult(installing)
        self.reactor.advance(childprocess.KILL_GRACE)
        self.assertEqual(ninja.signals, ["TERM", "KILL"])
        ninja.finish(137)
        self.remove_work()
        self.failureResultOf(installing, CancelledError)
        self.assertEqual(self.reactor.getDelayedCalls(), [])
        self.assertFalse(self.dest.exists())

    def test_waits_for_another_build(self) -> None:
        """A build in progress elsewhere is awaited; its result is used, not rebuilt."""
        self.dest.parent.mkdir(parents=True)
        with open(self.dest.with_name(f"{source.PIN}.lock"), "wb") as other:
            fcntl.flock(other, fcntl.LOCK_EX)
            installing = self.fixture.install()
            self.reactor.advance(build.LOCK_POLL)
            self.assertEqual(self.fixture.reports[-1], "waiting for another daemon's build")
            self.assertEqual(self.reactor.children, [])
            executable(self.dest / "bin" / "llama-server")
        self.reactor.advance(build.LOCK_POLL)
        self.reactor.next("llama-server").finish(0, stderr=VERSION_OUTPUT)
        self.assertEqual(self.successResultOf(installing), "llama.cpp 0c1e570")

    def test_stale_work_removed(self) -> None:
        self.dest.parent.mkdir(parents=True)
        stale = self.dest.parent / f".{source.PIN}.build-crashed"
        stale.mkdir()
        installing = self.fixture.install()
        rm = self.reactor.next("rm")
        self.assertEqual(rm.argv[-1], str(stale))
        stale.rmdir()
        rm.finish(0)
        installing.cancel()
        self.reactor.next(os.path.basename(sys.executable)).finish(143)
        self.remove_work()
        self.failureResultOf(installing, CancelledError)

    def test_missing_tools(self) -> None:
        (self.fixture.bin / "ninja").unlink()
        (self.fixture.bin / "cmake").unlink()
        failure = self.failureResultOf(self.fixture.install(), build.InstallFailed)
        self.assertEqual(
            failure.getErrorMessage(),
            f"cannot build llama.cpp: cmake not found on PATH, beside {sys.executable}"
            " nor as a Python package",
        )


class ProgressTests(SynchronousTestCase):
    def test_ninja(self) -> None:
        line = "[123/410] Building CXX object src/CMakeFiles/llama.dir/llama.cpp.o"
        self.assertEqual(build.progress(line), "compiling 123/410")

    def test_make(self) -> None:
        line = "[ 45%] Building CXX object src/CMakeFiles/llama.dir/llama.cpp.o"
        self.assertEqual(build.progress(line), "compiling 45%")
        self.assertEqual(build.progress("[100%] Built target llama-server"), "compiling 100%")

    def test_other_lines(self) -> None:
        self.assertIsNone(build.progress("-- Configuring done"))
        self.assertIsNone(build.progress("In file included from [1/2]"))


class CommandTests(SynchronousTestCase):
    def installed(self, cache: CacheConfig | None = None) -> LlamaCppBackend:
        fixture = Fixture(self, cache=cache)
        self.home = fixture.home
        self.executable = executable(fixture.bin / "llama-server")
        installing = fixture.install()
        fixture.reactor.next("llama-server").finish(0, stderr=VERSION_OUTPUT)
        fixture.reactor.next("llama-server").finish(0, stdout=NO_DEVICES)
        self.successResultOf(installing)
        return fixture.backend

    def test_completion(self) -> None:
        command = self.installed().command(model(), COMPLETION, "/run/r1.sock", RunnerSettings(parallel=4))
        self.assertEqual(command.executable, str(self.executable))
        self.assertEqual(
            command.args,
            (
                *("--model", "/models/blobs/sha256/abab", "--host", "/run/r1.sock"),
                *("--alias", "ai/tiny:latest", "--ctx-size", "16384", "--parallel", "4"),
                *("--kv-unified", "--kv-unified-per-slot", "4096"),
                *("--metrics", "--jinja", "--no-webui"),
                *("--cache-ram", "0", "--slot-save-path", str(self.home / "cache")),
            ),
        )
        self.assertIsNone(command.env)

    def test_the_prompt_caches_flags(self) -> None:
        """llama-server's RAM cache is what [cache] runner_ram says, and counted in the runner's memory;
        only completion runners save their slots, and none with [cache] off."""
        ram = 512 * 2**20
        backend = self.installed(cache=CacheConfig(runner_ram=ram, folder="/states"))
        completion = backend.command(model(), COMPLETION, "/run/r1.sock", RunnerSettings())
        self.assertEqual(completion.args[-4:], ("--cache-ram", "512", "--slot-save-path", "/states"))
        embedding = backend.command(model(), EMBEDDING, "/run/e.sock", RunnerSettings())
        self.assertNotIn("--slot-save-path", embedding.args)
        plain = self.installed().memory(model(), COMPLETION, RunnerSettings())
        self.assertEqual(backend.memory(model(), COMPLETION, RunnerSettings()), plain + ram)
        footprint = backend.footprint(model(), COMPLETION, RunnerSettings())
        self.assertEqual(
            footprint.host, self.installed().footprint(model(), COMPLETION, RunnerSettings()).host + ram
        )
        off = self.installed(cache=CacheConfig(enabled=False))
        args = off.command(model(), COMPLETION, "/run/r1.sock", RunnerSettings()).args
        self.assertEqual(args[-2:], ("--cache-ram", "0"))

    def test_modes_threads_and_flags(self) -> None:
        backend = self.installed()
        settings = RunnerSettings(context_size=2048, threads=2, flags=("--temp", "0"))
        embedding = backend.command(model(), EMBEDDING, "/run/e.sock", settings)
        self.assertEqual(embedding.args[-5:], ("--cache-ram", "0", "--embeddings", "--temp", "0"))
        self.assertEqual(embedding.args[embedding.args.index("--ctx-size") + 1], "2048")
        reranker = model({"architecture": "qwen3", "gguf": {"qwen3.pooling_type": "4"}})
        reranking = backend.command(reranker, RERANKING, "/run/r.sock", RunnerSettings())
        self.assertEqual(reranking.args[-2:], ("--embeddings", "--reranking"))
        self.assertNotIn("--threads", reranking.args)

    def test_only_rank_pooling_reranks(self) -> None:
        error = self.assertRaises(
            BadRequest, self.installed().command, model(), RERANKING, "/run/r.sock", RunnerSettings()
        )
        self.assertEqual(error.code, "model_cannot_rerank")

    def test_a_model_without_pooling_does_not_embed(self) -> None:
        """A chat model's GGUF gives no pooling type (or none): refused before any runner starts."""
        for metadata in ({}, {"llama.pooling_type": "0"}):
            chat = model({"architecture": "llama", "gguf": {"general.architecture": "llama", **metadata}})
            error = self.assertRaises(
                BadRequest, self.installed().command, chat, EMBEDDING, "/run/e.sock", RunnerSettings()
            )
            self.assertEqual(error.code, "model_cannot_embed")
            self.assertIn("is not an embedding model", error.message)
        embedder = model({"architecture": "bert", "gguf": {"bert.pooling_type": "1"}})
        self.installed().command(embedder, EMBEDDING, "/run/e.sock", RunnerSettings())

    def test_socket_must_end_in_sock(self) -> None:
        with self.assertRaises(ValueError):
            self.installed().command(model(), COMPLETION, "/run/r1", RunnerSettings())

    def test_not_installed(self) -> None:
        with self.assertRaises(RuntimeError):
            Fixture(self).backend.command(model(), COMPLETION, "/run/r.sock", RunnerSettings())

    def test_memory_estimate(self) -> None:
        gguf = Path(self.mktemp())
        gguf.write_bytes(b"x" * 1000)
        smollm2_shape = {
            "llama.block_count": "30",
            "llama.embedding_length": "576",
            "llama.attention.head_count": "9",
            "llama.attention.head_count_kv": "3",
        }
        described = attrs.evolve(model({"architecture": "llama", "gguf": smollm2_shape}), gguf=str(gguf))
        kv_cache = 30 * 4096 * 3 * (64 + 64) * 2
        compute = 512 * 4096 * 2 + 512 * 576 * 48
        self.assertEqual(
            memory_estimate(described, RunnerSettings(context_size=4096)),
            1000 + kv_cache + compute + BASE_RSS,
        )
        twice = memory_estimate(described, RunnerSettings(context_size=4096, parallel=2))
        self.assertEqual(
            twice - memory_estimate(described, RunnerSettings(context_size=4096, parallel=1)),
            kv_cache + 512 * 4096 * 2,
            "the cache and the mask hold a whole context for each parallel slot",
        )

    def test_context_size(self) -> None:
        self.assertEqual(context_size(model(), RunnerSettings()), 4096)
        self.assertEqual(context_size(model({"context_size": 8192}), RunnerSettings()), 8192)
        self.assertEqual(context_size(model({"context_size": 131072}), RunnerSettings()), 8192)
        self.assertEqual(context_size(model({"context_size": 8192}), RunnerSettings(context_size=512)), 512)
        gguf = {"llama.context_length": 8192}
        trained = model({"context_size": 8192, "architecture": "llama", "gguf": gguf})
        self.assertEqual(
            context_size(trained, RunnerSettings(context_size=100000)),
            8192,
            "llama-server would hold a cache for 100000 tokens and give each request 8192",
        )

    def test_cache_root(self) -> None:
        self.assertEqual(cache_root({}, {"HOME": "/h"}), Path("/h/.cache/mrunner"))
        self.assertEqual(cache_root({}, {"XDG_CACHE_HOME": "/x"}), Path("/x/mrunner"))
        self.assertEqual(cache_root({"cache": "/c"}, {"XDG_CACHE_HOME": "/x"}), Path("/c"))


class ChildProcessTests(SynchronousTestCase):
    def test_lines_and_exit(self) -> None:
        reactor = FakeProcessReactor()
        lines: list[str] = []
        running = childprocess.run(reactor, ["tool", "a"], on_line=lines.append)
        child = reactor.next("tool")
        child.protocol.childDataReceived(1, b"one\r\ntw")
        child.protocol.childDataReceived(2, b"err\n")
        child.finish(0, stdout=b"o")
        exit = self.successResultOf(running)
        self.assertEqual(lines, ["one", "err", "two"])
        self.assertEqual(exit, childprocess.Exit(("tool", "a"), 0, None, ("one", "err", "two")))

    def test_failure_describes_tail(self) -> None:
        reactor = FakeProcessReactor()
        running = childprocess.run(reactor, ["/usr/bin/tool"], keep=2)
        reactor.next("tool").finish(2, stderr=b"a\nb\nc\n")
        failure = self.failureResultOf(running, childprocess.ChildFailed)
        self.assertEqual(failure.getErrorMessage(), "tool exited with code 2\nb\nc")

    def test_ended_after_exit(self) -> None:
        reactor = FakeProcessReactor()
        child = childprocess.spawn(reactor, ["tool"])
        reactor.next("tool").finish(0)
        self.assertEqual(self.successResultOf(child.ended()).code, 0)
        child.kill()  # already gone: nothing to signal
        self.assertEqual(reactor.getDelayedCalls(), [])
