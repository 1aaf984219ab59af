"""Three mrunner nodes behind a real router (vLLM's vllm-router, from PyPI), the openai client in front.

Each node is a ``twistd mrunner`` process with its own home and a tap.conf
that names its preload and a registry every node shares (the real
docker-registry): the nodes start with empty stores and pull their model. Model
A is on nodes 1 and 2, model B on node 3. The router runs in its multi-model
mode; the client talks only to the router; where each request landed is read
from each node's C{GET /engines/requests}.

The runners are the scripted stand-in (tests/support/runner_program.py) serving
tiny GGUFs: a stream waits at a gate (a file) the test opens, so "in flight"
is a fact when a node is killed or drained, however fast or loaded the machine.
The cost is the five processes' start-up: well under a minute on an idle
machine, two on a loaded one.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import treq
from openai import OpenAI
from twisted.internet import reactor
from twisted.internet.defer import Deferred, ensureDeferred, gatherResults
from twisted.internet.error import ConnectError
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import TestCase
from twisted.web.client import ResponseNeverReceived

from mrunner.config import RegistryConfig
from tests.support.daemon import (
    _Output,
    free_port,
    http,
    short_home,
    spawn_twistd,
    stop_twistd,
    write_config,
)
from tests.support.ggufs import write_tiny_gguf
from tests.support.registry_cases import Side
from tests.support.registry_server import SKIP, RealRegistry

A, B = "ai/tiny-a", "ai/tiny-b"
ROUTER = Path(sys.executable).with_name("vllm-router")
CHAT = [{"role": "user", "content": "hi"}]
EVENTS = 5  # tokens in each held stream


def router_skip() -> str | None:
    if SKIP:
        return SKIP
    if not ROUTER.exists() and shutil.which("vllm-router") is None:
        return "vllm-router is not installed: pip install -e '.[test]' installs it (a wheel from PyPI)"
    return None


class Node:
    """One ``twistd mrunner`` with its own home, on a loopback port, preloading C{model}."""

    def __init__(self, test: TestCase, registry: str, model: str, extra: str = "") -> None:
        self.home = short_home(test, "mr-node-")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.model = model
        self.config = write_config(
            self.home,
            f'listen = "tcp:{self.port}:interface=127.0.0.1"\n[registry]\ndefault = "{registry}"\n'
            f'[scheduler]\nparallel = 4\n[http]\ndrain_timeout = "60s"\n[models]\npreload = ["{model}"]\n'
            # Every record kept: a drained node's 503s must not push out the 200s the test counts.
            f"[records]\nper_model = 1000\n{extra}",
        )
        self.process: Any = None

    def start(self) -> None:
        self.process = spawn_twistd(self.config, self.home)

    async def stop(self) -> None:
        if self.process is not None and self.process.pid is not None:
            await stop_twistd(self.process)

    def kill(self) -> Deferred[None]:
        self.process.signalProcess("KILL")
        ended: Deferred[None] = self.process.output.ended
        return ended

    async def ready(self) -> bool:
        try:
            response = await http.get(self.url + "/ready")
            await response.content()
        except Exception:  # not listening yet
            return False
        return bool(response.code == 200)

    async def get_json(self, path: str) -> Any:
        response = await http.get(self.url + path)
        return json.loads(await response.text())

    async def served(self, model: str) -> int:
        """Requests for C{model} this node answered with 200, from its records."""
        records = await self.get_json(f"/engines/requests?model={model}&limit=1000")
        return sum(1 for record in records if record["status"] == 200)

    async def metrics(self) -> dict[str, float]:
        response = await http.get(self.url + "/metrics")
        text = await response.text()
        return {
            line.split()[0]: float(line.split()[-1])
            for line in text.splitlines()
            if line.startswith("vllm:") and "{" not in line
        }


class Router:
    """``vllm-router --enable-igw``: nodes are added by model and health-checked every second.

    This version's health checker asks C{/health} whatever C{--health-check-endpoint} says, so a
    drained node stays in its list: its 503 is what makes the router retry elsewhere.
    """

    def __init__(self, test: TestCase) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.dir = short_home(test, "mr-router-")
        self.output = _Output(self.dir, "router.log")

    def start(self) -> None:
        executable = str(ROUTER if ROUTER.exists() else shutil.which("vllm-router"))
        args = [
            *("--enable-igw", "--host", "127.0.0.1", "--port", str(self.port), "--policy", "round_robin"),
            *("--health-check-interval-secs", "1"),
            *("--health-failure-threshold", "1", "--health-success-threshold", "1"),
            *("--cb-timeout-duration-secs", "1"),
            *("--log-level", "warning"),
        ]
        self.process = reactor.spawnProcess(  # type: ignore[attr-defined]
            self.output, executable, [executable, *args], env=os.environ
        )

    async def stop(self) -> None:
        if self.process.pid is not None:
            self.process.signalProcess("TERM")
        await self.output.ended

    async def add(self, node: Node) -> None:
        body = {"url": node.url, "model_id": node.model}
        response = await treq.post(self.url + "/workers", json=body, persistent=False)
        text = await response.text()
        assert response.code == 200, text

    async def healthy(self) -> dict[str, bool]:
        response = await treq.get(self.url + "/workers", persistent=False)
        workers = json.loads(await response.text())["workers"]
        return {worker["url"]: worker["is_healthy"] for worker in workers}

    async def up(self) -> bool:
        try:
            response = await treq.get(self.url + "/workers", persistent=False)
            await response.content()
        except Exception:
            return False
        return bool(response.code == 200)

    def log(self) -> str:
        return (self.dir / "router.log").read_text(errors="replace")[-3000:]


class HeldStream:
    """A streamed chat through the router that stops after its first event until the gate opens.

    The scripted runner sends event i once the file C{gate}i exists (L{open_gate}).
    """

    def __init__(self, client: OpenAI, model: str, gate: Path) -> None:
        test = {"events": EVENTS + 1, "gate": str(gate)}  # max_tokens cuts it: finish_reason "length"
        self.done: Deferred[tuple[int, str | None]] = deferToThread(self._read, client, model, test)

    @staticmethod
    def _read(client: OpenAI, model: str, test: dict[str, Any]) -> tuple[int, str | None]:
        chunks, finish = 0, None
        stream = client.chat.completions.create(
            model=model, messages=CHAT, max_tokens=EVENTS, stream=True, extra_body={"test": test}
        )
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                chunks += 1
                finish = chunk.choices[0].finish_reason or finish
        return chunks, finish


def open_gate(gate: Path, last: int = EVENTS) -> None:
    """Let the streams waiting at C{gate} send their events up to C{last}."""
    for i in range(last + 1):
        Path(f"{gate}{i}").touch()


class ClusterTests(TestCase):
    skip = router_skip()
    timeout = 300  # a safety net: the test waits for events, never for an interval

    def setUp(self) -> Deferred[None]:
        return ensureDeferred(self.start())

    async def start(self) -> None:
        work = self.work = short_home(self, "mr-cluster-")
        registry = RealRegistry(work / "registry")
        await registry.start()
        self.addCleanup(lambda: ensureDeferred(registry.stop()))
        source = Side(work / "source", RegistryConfig(default=registry.host))
        for name, seed in ((A, 1), (B, 2)):
            gguf = work / f"{seed}.gguf"
            write_tiny_gguf(gguf, seed=seed)
            with gguf.open("rb") as f:
                await source.store.import_gguf(name, f)
            await source.push(name)
        self.nodes = [
            Node(self, registry.host, A),
            Node(self, registry.host, A),
            Node(self, registry.host, B, "[cluster]\nmetric_names = false\n"),
        ]
        for node in self.nodes:
            node.start()
            self.addCleanup(lambda node=node: ensureDeferred(node.stop()))
        self.router = Router(self)
        self.router.start()
        self.addCleanup(lambda: ensureDeferred(self.router.stop()))
        await self.until(self.router.up, 30, "the router answers")
        for node in self.nodes:
            await self.until(node.ready, 120, f"node {node.url} is ready")
            await self.router.add(node)
        await self.until(self.all_healthy, 30, "the router sees every node healthy")
        self.client = OpenAI(base_url=self.router.url + "/v1", api_key="unused", max_retries=0)

    async def until(
        self, condition: Callable[[], Any], seconds: float, what: str, every: float = 0.1
    ) -> None:
        """Ask the async C{condition} C{every} so often until it holds; past C{seconds} (a safety net),
        fail naming what never happened."""
        result = [False]

        async def check() -> None:
            result[0] = bool(await condition())

        for _ in range(int(seconds / every)):
            await check()
            if result[0]:
                return
            await deferLater(reactor, every)
        raise AssertionError(f"waited {seconds:g}s in vain: {what}\nrouter log:\n{self.router.log()}")

    async def all_healthy(self) -> bool:
        healthy = await self.router.healthy()
        return len(healthy) == len(self.nodes) and all(healthy.values())

    def chats(self, model: str, count: int, max_tokens: int = 3) -> Deferred[list[Any]]:
        """C{count} chats at once through the router; each result is the answer, or the exception."""

        def one() -> Any:
            try:
                return self.client.chat.completions.create(model=model, messages=CHAT, max_tokens=max_tokens)
            except Exception as e:
                return e

        return gatherResults([deferToThread(one) for _ in range(count)])

    async def served(self, model: str) -> list[int]:
        return [await node.served(model) for node in self.nodes]

    async def test_behind_vllm_router(self) -> None:
        one, two, three = self.nodes

        # Every request for A lands on node 1 or 2, both take a share; every one for B on node 3.
        answers = await self.chats(A, 12) + await self.chats(B, 6)
        failures = [a for a in answers if isinstance(a, Exception)]
        self.assertEqual(failures, [])
        a_served, b_served = await self.served(A), await self.served(B)
        self.assertEqual(a_served[2], 0)
        self.assertEqual(sum(a_served), 12)
        self.assertGreater(min(a_served[:2]), 0, f"both A nodes take a share: {a_served}")
        self.assertEqual(b_served, [0, 0, 6])

        # The load signals under vLLM's names (node 3 has them switched off).
        signals = await one.metrics()
        self.assertEqual(signals["vllm:num_requests_waiting"], 0)
        self.assertEqual(signals["vllm:num_requests_running"], 0)
        self.assertEqual(await three.metrics(), {})
        response = await http.get(one.url + "/metrics")
        self.assertIn(f'running_lora_adapters="{A}:latest,{A}"', await response.text())

        # SIGKILL node 2 with streams in flight: it costs at most those; the rest go to node 1.
        gate = self.work / "kill-gate"
        open_gate(gate, last=0)
        streams = [HeldStream(self.client, A, gate) for _ in range(4)]
        await self.until(lambda: self.running([one, two], 4), 60, "four streams are in flight")
        in_flight_on_two = (await two.metrics())["vllm:num_requests_running"]
        self.assertGreater(in_flight_on_two, 0, "round robin gave node 2 some of the streams")
        await two.kill()
        open_gate(gate)
        results = []
        for stream in streams:
            try:
                results.append(await stream.done)
            except Exception as e:
                results.append(e)
        lost = [r for r in results if isinstance(r, Exception) or r != (EVENTS, "length")]
        self.assertLessEqual(len(lost), in_flight_on_two, f"at most node 2's streams are lost: {results}")
        self.assertEqual(len(results) - len(lost), 4 - in_flight_on_two, f"node 1's finish: {results}")
        # The openai client stops at [DONE]; the answer's end (two writes, as llama-server's) comes after,
        # and the node counts a request served at its end.
        await self.until(lambda: self.idle(one), 30, "node 1's streams have ended")
        before = await one.served(A)
        answers = await self.chats(A, 6)
        self.assertEqual([a for a in answers if isinstance(a, Exception)], [], "the router sends them on")
        self.assertEqual(await one.served(A), before + 6)

        # The restarted node comes back into rotation once it is ready.
        two.start()
        await self.until(two.ready, 60, "node 2 is ready again")
        await self.until(self.all_healthy, 30, "the router sees node 2 healthy again")
        await self.until(lambda: self.served_again(two), 60, "node 2 serves requests again", every=0.5)

        # A drained node finishes its stream and gets no new requests. It answers 503 (Retry-After) and
        # /ready 503; vllm-router health-checks only /health, so it is the 503 that sends each request
        # on to another node (the router retries), where a Kubernetes readiness probe would take it out.
        gate = self.work / "drain-gate"
        open_gate(gate, last=0)
        streams = [HeldStream(self.client, A, gate) for _ in range(2)]
        await self.until(lambda: self.running([one, two], 2), 60, "two streams are in flight")
        self.assertEqual((await one.metrics())["vllm:num_requests_running"], 1, "round robin: one each")
        response = await http.post(one.url + "/engines/_drain")
        self.assertEqual(json.loads(await response.text()), {"draining": True, "in_flight": 1})
        self.assertFalse(await one.ready())
        open_gate(gate)
        for stream in streams:
            self.assertEqual(await stream.done, (EVENTS, "length"), "each stream finishes whole")
        await self.until(lambda: self.idle(two), 30, "node 2's stream has ended")  # as node 1's above
        served_by_two = await two.served(A)
        response = await http.post(one.url + "/v1/chat/completions", json={"model": A, "messages": CHAT})
        refusal = json.loads(await response.text())
        self.assertEqual((response.code, refusal["error"]["code"]), (503, "draining"))
        self.assertEqual(response.headers.getRawHeaders(b"retry-after"), [b"1"])
        before = await one.served(A)
        answers = await self.chats(A, 6)
        self.assertEqual([a for a in answers if isinstance(a, Exception)], [], "the router retries elsewhere")
        self.assertEqual(await one.served(A), before, "the drained node gets no new requests")
        self.assertEqual(await two.served(A), served_by_two + 6)

        # SIGTERM drains as _drain does: the listener closes, the stream in flight finishes, then it exits.
        gate = self.work / "term-gate"
        open_gate(gate, last=0)
        stream = HeldStream(self.client, A, gate)
        await self.until(lambda: self.running([two], 1), 60, "a stream is in flight on node 2")
        two.process.signalProcess("TERM")
        await self.until(lambda: self.refused(two), 60, "node 2 stops listening")
        self.assertFalse(two.process.output.ended.called, "node 2 waits for its stream")
        open_gate(gate)
        self.assertEqual(await stream.done, (EVENTS, "length"))
        await two.process.output.ended  # twistd ends by the signal it got, once stopped: no exit code

    async def served_again(self, node: Node) -> bool:
        """Send a request for A; whether C{node} has served any since its restart.

        The router's circuit breaker, open since the kill, lets a request through
        again a second after it opened (C{--cb-timeout-duration-secs}).
        """
        answers = await self.chats(A, 1)
        self.assertEqual([a for a in answers if isinstance(a, Exception)], [])
        return await node.served(A) > 0

    async def refused(self, node: Node) -> bool:
        try:
            response = await http.get(node.url + "/health")
            await response.content()
        except (ConnectError, ResponseNeverReceived):  # refused or reset as it closes, or closing as it took
            return True
        return False

    async def idle(self, node: Node) -> bool:
        return (await node.metrics()).get("vllm:num_requests_running", 0) == 0

    async def running(self, nodes: list[Node], count: int) -> bool:
        total = 0.0
        for node in nodes:
            total += (await node.metrics()).get("vllm:num_requests_running", 0)
        return total >= count
