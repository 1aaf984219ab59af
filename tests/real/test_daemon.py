"""The whole path with real processes: HTTP client → mrunner → tests/support/runner_program.py and back.

These tests run on the real reactor and start real runner processes.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import sys
from pathlib import Path
from typing import Any

from openai import OpenAI
from twisted.internet import reactor
from twisted.internet.defer import DeferredList, ensureDeferred
from twisted.internet.threads import deferToThread
from twisted.internet.utils import getProcessOutputAndValue
from twisted.trial.unittest import TestCase

from mrunner.home import Home
from tests.support.daemon import (
    alive,
    eventually,
    http,
    lines,
    short_home,
    sleep,
    spawn_twistd,
    stop_twistd,
    unix_client,
    write_config,
)
from tests.support.daemon_cases import HI, MODEL, DaemonTestCase
from tests.support.ggufs import write_tiny_gguf

TWISTD = str(Path(sys.executable).with_name("twistd"))
MRUNNER = str(Path(sys.executable).with_name("mrunner"))


class RefusalTests(DaemonTestCase):
    runner_args = ("--context", "12")

    async def test_a_runner_400_is_relayed_and_a_context_too_small_is_told_plainly(self) -> None:
        await self.start()
        code, answer, _ = await self.post("/v1/chat/completions", self.chat(test={"refuse": 400}))
        expected = {"code": 400, "message": "told to refuse", "type": "invalid_request_error"}
        self.assertEqual((code, answer), (400, {"error": expected}), "the runner's own words")
        for stream in (False, True):
            long = [{"role": "user", "content": "word " * 12}]
            code, answer, _ = await self.post("/v1/chat/completions", self.chat(messages=long, stream=stream))
            self.assertEqual((code, answer["error"]["code"]), (400, "context_length_exceeded"), answer)
            self.assertEqual(
                answer["error"]["message"],
                "the conversation (12 tokens) no longer fits in the model's context of 12 tokens:"
                " start a new conversation, or drop its oldest turns; or raise the model's context size"
                " (mrunner configure --context-size, or context_size in tap.conf), up to the context it"
                " was trained for",
            )
        code, answer, _ = await self.post("/v1/chat/completions", self.chat())
        self.assertEqual(code, 200, "the runner's connection went on serving")


class PathTests(DaemonTestCase):
    async def test_openai_client(self) -> None:
        await self.start()
        client = OpenAI(
            base_url=self.daemon.url + "/engines/v1",
            api_key="none",
            max_retries=0,
            default_headers={"Connection": "close"},  # leave no connection open after the test
        )
        reply = await deferToThread(
            client.chat.completions.create, model=MODEL, messages=[{"role": "user", "content": "hello"}]
        )
        self.assertEqual(reply.choices[0].message.content, "echo: hello")
        self.assertEqual(reply.model, MODEL)
        chunks = await deferToThread(
            lambda: list(client.chat.completions.create(model=MODEL, messages=HI, stream=True))
        )
        self.assertEqual("".join(c.choices[0].delta.content or "" for c in chunks), "tok0 tok1 tok2 ")
        embedding = await deferToThread(client.embeddings.create, model=MODEL, input=["a", "bcd"])
        self.assertEqual([e.embedding[0] for e in embedding.data], [1.0, 3.0])
        models = await deferToThread(client.models.list)
        self.assertIn(MODEL, [m.id for m in models.data])

    async def test_streaming_is_not_buffered(self) -> None:
        await self.start()
        gate = str(self.home / "gate")
        Path(f"{gate}0").touch()
        response, events = await self.open_stream({"test": {"events": 2, "gate": gate}})
        self.assertEqual(response.code, 200)
        self.assertEqual(response.headers.getRawHeaders(b"content-type"), [b"text/event-stream"])
        await events.arrived(b"tok0")  # while the runner holds tok1 back: the first was not buffered
        self.assertFalse(events.done.called, "the stream is still open")
        self.assertNotIn(b"tok1", events.data)
        Path(f"{gate}1").touch()
        await events.arrived(b"tok1")
        self.assertTrue(await events.done)
        self.assertIn(b"data: [DONE]", events.data)

    async def test_client_disconnect_cancels_upstream_and_releases(self) -> None:
        await self.start()
        _, events = await self.gated_stream()
        (runner,) = self.daemon.scheduler.snapshot()
        self.assertEqual(runner.in_use, 1)
        events.transport.stopProducing()
        await eventually(lambda: lines(self.home / "events") == ["cancelled"])
        self.assertEqual([r.in_use for r in self.daemon.scheduler.snapshot()], [0])

    async def test_twenty_concurrent_requests_start_one_runner(self) -> None:
        await self.start()
        results = await DeferredList(
            [ensureDeferred(self.post("/v1/chat/completions", self.chat())) for _ in range(20)],
            consumeErrors=True,
        )
        self.assertEqual([r[1][0] for r in results], [200] * 20)
        self.assertEqual(len(lines(self.home / "starts")), 1)

    async def test_runner_crash_mid_stream(self) -> None:
        await self.start()
        _, events = await self.open_stream({"test": {"events": 3, "crash_after": 1}})
        await events.done
        self.assertIn(b"tok0", events.data)
        self.assertIn(b'"error"', events.data)
        # The socket may close a reactor turn before the child's exit is reaped.
        await eventually(lambda: not self.daemon.scheduler.snapshot())
        code, body, _ = await self.post("/v1/chat/completions", self.chat())
        self.assertEqual((code, body["choices"][0]["message"]["content"]), (200, "echo: hi"))
        self.assertEqual(len(lines(self.home / "starts")), 2)

    async def test_a_runner_dying_mid_stream_is_told_in_words(self) -> None:
        await self.start()
        _, events = await self.open_stream({"test": {"events": 3, "crash_after": 1}})
        await events.done
        last = json.loads(events.data.split(b"data: ")[-1])
        self.assertEqual(
            last["error"]["message"], "the runner stopped in the middle of the answer: its connection closed"
        )

    async def test_runner_dies_before_headers_is_502(self) -> None:
        await self.start()
        code, body, _ = await self.post(
            "/v1/chat/completions", self.chat(stream=True, test={"crash_after": 0})
        )
        self.assertEqual(code, 502)
        self.assertIn("runner", body["error"]["message"])

    async def test_stop_service_ends_every_runner(self) -> None:
        await self.start()
        for mode_path in ("/v1/chat/completions", "/v1/embeddings"):
            code, _, _ = await self.post(mode_path, {"model": MODEL, "input": "x", "messages": HI})
            self.assertEqual(code, 200)
        pids = self.runner_pids()
        self.assertEqual(len(pids), 2)
        await self.daemon.service.stopService()
        self.assertEqual([pid for pid in pids if alive(pid)], [])
        self.assertEqual(list((self.home / "run").iterdir()), [])


class KeepAliveRaceTests(DaemonTestCase):
    """A runner that closes every connection after an answer that announced keep-alive."""

    runner_args = ("--close-after-answer",)

    async def test_a_cold_burst_of_twenty_streams_loses_none(self) -> None:
        await self.start()
        for _ in range(2):  # cold, then onto the connections the first burst left behind
            streams = [self.post("/v1/chat/completions", self.chat(stream=True)) for _ in range(20)]
            results = await DeferredList([ensureDeferred(s) for s in streams], consumeErrors=True)
            answers = [result if ok else repr(result) for ok, result in results]
            self.assertEqual([answer[0] for answer in answers], [200] * 20, answers)
            for _, text, _ in answers:
                self.assertIn("tok0 ", text)
                self.assertTrue(text.endswith("data: [DONE]\n\n"), text)
        self.assertEqual(len(lines(self.home / "starts")), 1)


class FailingRunnerTests(DaemonTestCase):
    runner_args = ("--exit-at-start",)

    async def test_runner_that_exits_at_start_is_500_with_its_stderr(self) -> None:
        await self.start()
        code, body, _ = await self.post("/v1/chat/completions", self.chat())
        self.assertEqual(code, 500)
        self.assertIn("told to fail at start", body["error"]["message"])
        code, body, headers = await self.post("/v1/chat/completions", self.chat())
        self.assertEqual(code, 503)
        self.assertTrue(headers.getRawHeaders(b"retry-after"))


class SlowRunnerTests(DaemonTestCase):
    runner_args = ("--health-delay", "0.5")

    async def test_waits_for_health(self) -> None:
        await self.start()
        code, _, _ = await self.post("/v1/chat/completions", self.chat())
        self.assertEqual(code, 200)


class TwistdTests(TestCase):
    """``twistd -n mrunner`` as users start it."""

    timeout = 60

    async def start(self) -> tuple[Path, Path, Any, Any]:
        """``twistd`` on a UNIX socket, with the tiny model imported: its home, config, process, client."""
        home = short_home(self)
        config = write_config(home, 'listen = "unix:{}"'.format(home / "api.sock"))
        process = spawn_twistd(config, home)
        self.addCleanup(lambda: ensureDeferred(stop_twistd(process)))
        client = unix_client(str(home / "api.sock"))
        await eventually(lambda: (home / "api.sock").exists(), 10)
        gguf = home / "tiny.gguf"
        write_tiny_gguf(gguf)
        with gguf.open("rb") as f:
            response = await client.post("http://d/models/load", params={"name": MODEL}, data=f)
            await response.content()
        return home, config, process, client

    async def runner(self, home: Path, client: Any) -> int:
        """The pid of the runner a chat starts."""
        response = await client.post("http://d/v1/chat/completions", json={"model": MODEL, "messages": HI})
        self.assertEqual(response.code, 200)
        await response.content()
        (runner_pid,) = map(int, lines(home / "starts"))
        self.assertTrue(alive(runner_pid))
        return runner_pid

    async def test_sigkill_of_the_daemon_takes_its_runners(self) -> None:
        home, _, process, client = await self.start()
        runner_pid = await self.runner(home, client)
        os.kill(process.pid, signal.SIGKILL)
        await eventually(lambda: not alive(runner_pid), 1, what=lambda: "the runner to die with its daemon")

    async def test_runners_are_out_of_the_terminals_reach(self) -> None:
        """Each runner leads a session and process group of its own: a Ctrl-C (SIGINT to the terminal's
        foreground group) reaches the daemon only, which saves the runner's slots before it stops it
        (issue 53 N2; tests/real/test_terminal.py presses it)."""
        home, _, process, client = await self.start()
        runner_pid = await self.runner(home, client)
        self.assertEqual((os.getsid(runner_pid), os.getpgid(runner_pid)), (runner_pid, runner_pid))
        self.assertNotEqual(os.getsid(runner_pid), os.getsid(process.pid))

    async def test_sighup_reloads_pins_and_preloads(self) -> None:
        _, config, process, client = await self.start()
        config.write_text(
            config.read_text().replace(
                "[backends.test]",
                f'[models]\npreload = ["{MODEL}"]\n[models."{MODEL}"]\npinned = true\n[backends.test]',
            )
        )
        os.kill(process.pid, signal.SIGHUP)
        ready: dict[str, Any] = {}

        async def poll() -> None:
            response = await client.get("http://d/ready")
            ready.update(await response.json())

        for _ in range(1000):
            await poll()
            if ready.get("ready"):
                break
            await sleep(0.01)
        self.assertEqual(
            ready,
            {
                "ready": True,
                "draining": False,
                "preloads": [{"model": MODEL, "state": "loaded", "error": None}],
                "failed": [],
            },
        )
        response = await client.get("http://d/engines/ps")
        (runner,) = await response.json()
        self.assertEqual((runner["model_name"], runner["pinned"], runner["keep_alive"]), (MODEL, True, None))

    async def test_a_second_daemon_on_one_home_exits_naming_the_first(self) -> None:
        """It exits 1 with one line, and the first keeps serving: its runners, sockets and store untouched."""
        home, config, first, client = await self.start()
        staged = home / "models" / "blobs" / "sha256" / "import-1.incomplete"
        staged.write_bytes(b"an import in progress")
        second = spawn_twistd(config, home, output_name="second.out")
        self.addCleanup(lambda: ensureDeferred(stop_twistd(second)))
        await second.output.ended
        self.assertEqual(second.output.exit_code, 1)
        (said,) = (home / "second.out").read_text().splitlines()
        self.assertTrue(
            said.startswith(f"mrunner: another mrunner daemon (pid {first.pid}) is using {home};")
        )
        self.assertTrue(staged.exists())
        response = await client.get("http://d/health")
        self.assertEqual(response.code, 200)
        await response.content()

    async def test_an_address_in_use_exits_non_zero_with_one_line(self) -> None:
        home = short_home(self)
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            config = write_config(home, f'listen = "tcp:{port}:interface=127.0.0.1"')
            process = spawn_twistd(config, home)
            self.addCleanup(lambda: ensureDeferred(stop_twistd(process)))
            await process.output.ended
        self.assertEqual(process.output.exit_code, 1)
        errors = [line for line in (home / "twistd.out").read_text().splitlines() if "error" in line]
        self.assertEqual(len(errors), 1, errors)
        self.assertIn(f"cannot listen on tcp:{port}:interface=127.0.0.1: Address already in use", errors[0])
        self.assertEqual(lines(home / "starts"), [])


class StartTests(TestCase):
    """``twistd -n mrunner`` as the README and ``make run`` start it, and the mistakes a newcomer makes."""

    timeout = 60

    async def test_start_up_mistakes_are_one_line(self) -> None:
        """Not twistd's whole usage text before it: a bad --listen, a bad tap.conf value."""
        home = short_home(self)
        good = write_config(home)
        bad = home / "bad.conf"
        bad.write_text("[scheduler]\nkeep_alive = 'soon'\n")
        for args, words in [
            (["--config", str(good), "--listen", "garbage:1"], "'garbage:1' is not a Twisted endpoint"),
            (["--config", str(bad)], "scheduler.keep_alive"),
        ]:
            out, err, code = await getProcessOutputAndValue(
                TWISTD, ["-n", "mrunner", *args], env=os.environ, path=str(home)
            )
            said = (out + err).decode().splitlines()
            self.assertEqual((code, len(said)), (1, 1), said)
            self.assertTrue(said[0].startswith("mrunner: "), said)
            self.assertIn(words, said[0])

    async def test_make_run_waits_on_the_real_address_and_a_second_start_only_fails(self) -> None:
        """What ``make run`` does: start twistd, ``mrunner wait --pid`` for its address, here not 12434.

        twistd leaves no twistd.pid in the folder it starts in; a second daemon on the home exits
        with mrunner's message naming the first's pid, and waiting on it fails without an address.
        """
        home = short_home(self)
        config = write_config(home, 'listen = "tcp:0:interface=127.0.0.1"')
        first = spawn_twistd(config, home, default_pidfile=True)
        self.addCleanup(lambda: ensureDeferred(stop_twistd(first)))
        env = {k: v for k, v in os.environ.items() if k != "MRUNNER_HOST"} | {"MRUNNER_HOME": str(home)}
        out, err, code = await getProcessOutputAndValue(
            MRUNNER, ["wait", "--pid", str(first.pid)], env=env, reactor=reactor
        )
        self.assertEqual(code, 0, err)
        url = out.decode().strip()
        self.assertRegex(url, r"^http://127\.0\.0\.1:\d+$")
        self.assertNotEqual(url, "http://127.0.0.1:12434")
        response = await http.get(url + "/health")
        self.assertEqual(response.code, 200)
        await response.content()
        self.assertFalse((home / "twistd.pid").exists())

        second = spawn_twistd(config, home, output_name="second.out", default_pidfile=True)
        self.addCleanup(lambda: ensureDeferred(stop_twistd(second)))
        out, err, code = await getProcessOutputAndValue(
            MRUNNER, ["wait", "--pid", str(second.pid)], env=env, reactor=reactor
        )
        self.assertEqual((code, out), (1, b""), "no address: that daemon is not the one answering")
        await second.output.ended
        (said,) = (home / "second.out").read_text().splitlines()
        self.assertTrue(said.startswith(f"mrunner: another mrunner daemon (pid {first.pid}) is using"), said)
        self.assertFalse((home / "twistd.pid").exists())
        await stop_twistd(first)
        self.assertFalse(Home(home).address.exists(), "removed when the daemon stops")


class QueueTests(DaemonTestCase):
    config_text = "[scheduler]\nparallel = 1\nmax_runners = 1\n"

    async def test_waiter_whose_client_leaves_is_dropped(self) -> None:
        await self.start()
        gate, events = await self.gated_stream()
        waiting = ensureDeferred(self.post("/v1/chat/completions", self.chat()))
        waiting.addErrback(lambda _: None)
        scheduler = self.daemon.scheduler
        await eventually(lambda: scheduler.queued() == 1)
        waiting.cancel()
        await eventually(lambda: scheduler.queued() == 0)
        Path(f"{gate}1").touch()
        self.assertTrue(await events.done)
        code, _, _ = await self.post("/v1/chat/completions", self.chat())
        self.assertEqual(code, 200)
        self.assertEqual(len(lines(self.home / "starts")), 1)


class LifecycleTests(DaemonTestCase):
    config_text = '[scheduler]\nkeep_alive = "5m"\n'

    async def test_files_are_private_and_the_environment_minimal(self) -> None:
        os.environ["MRUNNER_TEST_SECRET"] = "not for runners"
        self.addCleanup(os.environ.pop, "MRUNNER_TEST_SECRET", None)
        await self.start()
        code, _, _ = await self.post("/v1/chat/completions", self.chat())
        self.assertEqual(code, 200)
        (runner,) = self.daemon.scheduler.snapshot()
        home = self.daemon.scheduler.home
        modes = {
            path: stat.S_IMODE(path.stat().st_mode)
            for path in (home.root, home.run, home.logs, Path(runner.socket), Home.pid_file(runner.socket))
        }
        modes.update({path: stat.S_IMODE(path.stat().st_mode) for path in home.logs.glob("*.log")})
        expected = {path: 0o700 if path.is_dir() else 0o600 for path in modes}
        self.assertEqual(modes, expected)
        with open(f"/proc/{runner.pid}/environ", "rb") as f:
            names = {item.split(b"=", 1)[0].decode() for item in f.read().split(b"\0") if item}
        self.assertNotIn("MRUNNER_TEST_SECRET", names)
        self.assertIn("PATH", names)

    async def test_reload_over_http(self) -> None:
        await self.start()
        await self.post("/v1/chat/completions", self.chat())
        text = self.daemon.config_path.read_text()
        self.daemon.config_path.write_text(text.replace('keep_alive = "5m"', 'keep_alive = "1m"'))
        code, body, _ = await self.post("/engines/_reload", {})
        self.assertEqual((code, body), (200, {"status": "reloaded", "restart_required": []}))
        (runner,) = self.daemon.scheduler.snapshot()
        self.assertEqual(runner.keep_alive, 60, "the idle runner's keep-alive follows the new default")
        self.daemon.config_path.write_text(
            text.replace('keep_alive = "5m"', 'keep_alive = "5m"\nmax_runners = "many"')
        )
        code, body, _ = await self.post("/engines/_reload", {})
        self.assertEqual(code, 422)
        self.assertIn("scheduler.max_runners: expected an integer", body["error"]["message"])
        self.assertIn("nothing changed", body["error"]["message"])
        self.daemon.config_path.write_text(text.replace("[scheduler]", 'home = "/elsewhere"\n[scheduler]', 1))
        code, body, _ = await self.post("/engines/_reload", {})
        self.assertEqual(code, 422, "home twice is invalid TOML")
        self.daemon.config_path.write_text(text.replace(f'home = "{self.home}"', f'home = "{self.home}/x"'))
        code, body, _ = await self.post("/engines/_reload", {})
        self.assertEqual((code, body["restart_required"]), (200, ["home"]))
        self.assertEqual([r.pid for r in self.daemon.scheduler.snapshot()], [runner.pid], "no runner dropped")
