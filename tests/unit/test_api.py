"""The HTTP contract without processes: routes, the error table in its order, admin routes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
from treq.testing import StubTreq
from twisted.internet.task import Clock
from twisted.logger import formatEvent, globalLogPublisher
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.http_headers import Headers

from mrunner.api.door.routing import Routes
from mrunner.cache.turns import Counts
from mrunner.config import Config, SchedulerConfig
from mrunner.daemon.metrics import Metrics
from mrunner.errors import RunnerFailed
from mrunner.proxy.forwarder import forwarded_headers
from mrunner.scheduling.facade import Scheduler
from tests.support.asking import acquire
from tests.support.fakes import FakeBackend, FakeSpawner, FakeStore, model
from tests.support.loading import request
from tests.support.route_groups import daemon_groups

BASE = "http://mrunner"
CHAT = f"{BASE}/engines/v1/chat/completions"
CHAT_BODY = {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]}


class APITests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.backend = FakeBackend()
        self.store = FakeStore({"ai/smollm2:latest": model()})
        self.spawn = FakeSpawner()
        self.make(SchedulerConfig(install_wait=5, max_queue=2, max_runners=1, parallel=1))

    def make(self, scheduler_config: SchedulerConfig, max_request_bytes: int = 1000) -> None:
        config = attrs.evolve(Config(), scheduler=scheduler_config, max_request_bytes=max_request_bytes)
        metrics = Metrics()
        self.scheduler = Scheduler(
            self.clock,
            config,
            {"llama.cpp": self.backend},
            self.store,
            self.spawn.start_runner,
            events=metrics,
        )
        metrics.watch(self.scheduler)
        groups = daemon_groups(
            self.scheduler,
            self.store,
            self.clock,
            {"llama.cpp": self.backend},
            Path(self.mktemp()),
            max_request_bytes,
            metrics,
        )
        self.http = StubTreq(Routes(groups))

    def install(self) -> None:
        self.scheduler.start()
        self.backend.installs[-1].callback("llama.cpp test")

    def request(self, method: str, url: str, body: Any = None, **kwargs: Any):
        data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        d = self.http.request(method, url, data=data, **kwargs)
        self.http.flush()
        return d

    def answer(self, d) -> tuple[int, Any, Any]:
        self.http.flush()
        response = self.successResultOf(d)
        content = self.successResultOf(self.http.content(response))
        kind = response.headers.getRawHeaders(b"content-type", [b""])[0]
        return response.code, json.loads(content) if b"json" in kind else content, response.headers

    def assertError(self, d, status: int, *words: str) -> Any:
        code, body, headers = self.answer(d)
        self.assertEqual(code, status, body)
        self.assertLessEqual({"message", "type", "code"}, set(body["error"]))
        for word in words:
            self.assertIn(word, body["error"]["message"])
        return headers

    # service routes

    def test_root_and_health(self) -> None:
        self.assertEqual(self.answer(self.request("GET", f"{BASE}/"))[1], b"mrunner is running")
        self.assertEqual(self.answer(self.request("GET", f"{BASE}/health"))[0], 200)

    def test_trailing_slash(self) -> None:
        self.assertEqual(self.answer(self.request("GET", f"{BASE}/v1/models/"))[1]["object"], "list")
        self.assertEqual(self.answer(self.request("GET", f"{BASE}/engines/status/"))[0], 200)

    def test_unknown_path_is_json_404(self) -> None:
        self.assertError(self.request("GET", f"{BASE}/nope"), 404)
        self.assertError(self.request("POST", f"{BASE}/engines/v1/nope", {}), 404)

    def test_paths_that_broke_routing(self) -> None:
        """werkzeug redirects //; Klein answers non-UTF-8 paths in plain text with a logged traceback."""
        for path, words in [
            ("/engines//ps", "empty segment"),
            ("/models//etc/passwd", "empty segment"),
            ("/v1//models", "empty segment"),
            ("/engines/%FF/v1/models", "not UTF-8"),
            ("/v1/models/%FF", "not UTF-8"),
        ]:
            self.assertError(self.request("GET", BASE + path), 400, words)

    def test_status(self) -> None:
        self.assertEqual(
            self.answer(self.request("GET", f"{BASE}/engines/status"))[1],
            {"llama.cpp": "Not Installed"},
        )
        self.install()
        self.assertEqual(
            self.answer(self.request("GET", f"{BASE}/engines/status"))[1],
            {"llama.cpp": "Running: llama.cpp test"},
        )

    def test_model_list_in_openai_shape(self) -> None:
        for url in (
            f"{BASE}/v1/models",
            f"{BASE}/engines/v1/models",
            f"{BASE}/engines/llama.cpp/v1/models",
        ):
            code, body, _ = self.answer(self.request("GET", url))
            self.assertEqual(body["object"], "list")
            self.assertEqual([m["id"] for m in body["data"]], ["ai/smollm2:latest"])
        code, body, _ = self.answer(self.request("GET", f"{BASE}/v1/models/ai/smollm2"))
        self.assertEqual((code, body["id"], body["object"]), (200, "ai/smollm2:latest", "model"))
        self.assertError(self.request("GET", f"{BASE}/v1/models/ai/nothing"), 404)

    # the error table, row by row and in order

    def test_unknown_backend_comes_first(self) -> None:
        self.assertError(
            self.request("POST", f"{BASE}/engines/vllm/v1/chat/completions", b"x" * 5000),
            404,
            "vllm",
        )

    def test_body_too_large(self) -> None:
        self.assertError(self.request("POST", CHAT, b"{" + b" " * 2000 + b"}"), 413, "1000")

    def test_body_not_a_json_object(self) -> None:
        self.assertError(self.request("POST", CHAT, b"not json"), 400, "JSON")
        self.assertError(self.request("POST", CHAT, [1, 2]), 400, "JSON object")

    def test_model_missing_or_empty(self) -> None:
        self.assertError(self.request("POST", CHAT, {"messages": []}), 400, "model")
        self.assertError(self.request("POST", CHAT, {"model": ""}), 400, "model")
        self.assertError(self.request("POST", CHAT, {"model": 7}), 400, "model")

    def test_model_not_in_store_before_install_state(self) -> None:
        self.assertError(self.request("POST", CHAT, {**CHAT_BODY, "model": "ai/other"}), 404, "other")

    def test_backend_installing(self) -> None:
        self.scheduler.start()
        d = self.request("POST", CHAT, CHAT_BODY)
        self.assertNoResult(d)
        self.clock.advance(5)
        headers = self.assertError(d, 503, "llama.cpp")
        self.assertEqual(headers.getRawHeaders(b"retry-after"), [b"5"])

    def test_install_failed(self) -> None:
        self.scheduler.start()
        self.backend.installs[0].errback(FileNotFoundError("/opt/llama-server does not exist"))
        d = self.request("POST", CHAT, CHAT_BODY)
        self.backend.installs[1].errback(FileNotFoundError("/opt/llama-server does not exist"))
        self.assertError(d, 503, "/opt/llama-server")

    def test_queue_full(self) -> None:
        self.install()
        waiting = [self.request("POST", CHAT, CHAT_BODY) for _ in range(2)]
        headers = self.assertError(self.request("POST", CHAT, CHAT_BODY), 503, "waiting")
        self.assertEqual(headers.getRawHeaders(b"retry-after"), [b"1"])
        for d in waiting:
            self.assertNoResult(d)

    def test_routes_called_directly_answer_as_through_klein(self) -> None:
        """C{/v1/...} skips Klein's matching (L{Direct}); C{/engines/llama.cpp/...} does not."""
        self.install()
        via_klein = f"{BASE}/engines/llama.cpp/v1/chat/completions"
        for body in [b"not json", {"messages": []}, {**CHAT_BODY, "model": "ai/other"}, {"model": 7}]:
            self.assertEqual(
                self.answer(self.request("POST", CHAT, body))[:2],
                self.answer(self.request("POST", via_klein, body))[:2],
            )
        for url in (CHAT, via_klein):
            d = self.request("POST", url, {"model": "smollm2"}, headers={"X-Preload-Only": "true"})
            if len(self.spawn.processes) == 1 and not self.spawn.processes[0].ready.called:
                self.spawn.processes[0].ready.callback(None)
            self.assertEqual(self.answer(d)[:2], (200, {"status": "loaded", "model": "ai/smollm2:latest"}))

    def test_model_larger_than_the_memory_budget(self) -> None:
        self.make(SchedulerConfig(memory_budget=2**30))
        self.install()
        self.backend.need = 3 * 2**30
        self.assertError(self.request("POST", CHAT, CHAT_BODY), 422, "3.00 GiB", "1.00 GiB")
        self.assertEqual(self.spawn.processes, [])

    def test_images_for_a_model_without_a_projector(self) -> None:
        self.install()
        image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
        body = {"model": "smollm2", "messages": [{"role": "user", "content": [image]}]}
        self.assertError(self.request("POST", CHAT, body), 400, "no multimodal projector", "--mmproj")
        self.assertEqual(self.spawn.processes, [])
        self.store.models["ai/smollm2:latest"] = attrs.evolve(model(), files={"mmproj": "/p.gguf"})
        self.assertNoResult(self.request("POST", CHAT, body))
        self.assertEqual(len(self.spawn.processes), 1)

    def test_runner_failed_to_start(self) -> None:
        self.install()
        d = self.request("POST", CHAT, CHAT_BODY)
        self.spawn.processes[0].ready.errback(
            RunnerFailed("runner exited; its last output:\nerror: bad magic")
        )
        self.spawn.processes[0].exit()
        self.assertError(d, 500, "bad magic")
        headers = self.assertError(self.request("POST", CHAT, CHAT_BODY), 503, "paused")
        self.assertEqual(headers.getRawHeaders(b"retry-after"), [b"1"])

    def test_stopping(self) -> None:
        self.install()
        self.successResultOf(self.scheduler.close())
        self.assertError(self.request("POST", CHAT, CHAT_BODY), 503, "shutting down")

    # admin

    def test_preload_only_and_ps(self) -> None:
        self.install()
        d = self.request("POST", CHAT, {"model": "smollm2"}, headers={"X-Preload-Only": "true"})
        self.spawn.processes[0].ready.callback(None)
        code, body, _ = self.answer(d)
        self.assertEqual((code, body["status"]), (200, "loaded"))
        code, ps, _ = self.answer(self.request("GET", f"{BASE}/engines/ps"))
        self.assertEqual(
            [(r["model_name"], r["mode"], r["state"], r["in_use"]) for r in ps],
            [("ai/smollm2:latest", "completion", "ready", 0)],
        )
        (runner,) = ps
        self.assertEqual(runner["keep_alive"], 300)
        self.assertEqual(runner["expires_at"], "1970-01-01T00:05:00+00:00")
        self.assertEqual((runner["memory_estimate"], runner["memory_measured"]), (0, None))
        self.assertEqual(runner["pid"], 1)

    def test_keep_alive_in_a_request_body(self) -> None:
        self.install()
        d = self.request(
            "POST",
            CHAT,
            {"model": "smollm2", "keep_alive": "-1"},
            headers={"X-Preload-Only": "true"},
        )
        self.spawn.processes[0].ready.callback(None)
        self.answer(d)
        (runner,) = self.answer(self.request("GET", f"{BASE}/engines/ps"))[1]
        self.assertEqual((runner["keep_alive"], runner["expires_at"]), (None, None))
        self.assertError(
            self.request("POST", CHAT, {"model": "smollm2", "keep_alive": "soon"}),
            400,
            "keep_alive",
        )
        d = self.request(
            "POST", CHAT, {"model": "smollm2", "keep_alive": 0}, headers={"X-Preload-Only": "true"}
        )
        self.assertEqual(self.answer(d)[0], 200)
        self.assertEqual(self.spawn.processes[0].stops, 1, "keep_alive 0 unloads after the request")

    def test_keep_alive_values_that_broke_ps(self) -> None:
        """Huge keep-alives mean for ever; non-finite ones are refused; ps and metrics always answer."""
        self.install()
        preload = {"X-Preload-Only": "true"}
        for value in [b"1e12", b'"300000000000s"', b"1e308", b"-1e308"]:
            d = self.request("POST", CHAT, b'{"model": "smollm2", "keep_alive": %s}' % value, headers=preload)
            if not self.spawn.processes[0].ready.called:
                self.spawn.processes[0].ready.callback(None)
            self.assertEqual(self.answer(d)[0], 200, value)
            code, (runner,), _ = self.answer(self.request("GET", f"{BASE}/engines/ps"))
            self.assertEqual((code, runner["keep_alive"], runner["expires_at"]), (200, None, None), value)
            self.assertEqual(self.answer(self.request("GET", f"{BASE}/metrics"))[0], 200)
        for value in [b"NaN", b"Infinity", b"-Infinity", b"1e400", b"1" + b"0" * 400]:
            body = b'{"model": "smollm2", "keep_alive": %s}' % value
            self.assertError(self.request("POST", CHAT, body, headers=preload), 400)
        error = self.answer(self.request("POST", CHAT, {"model": "smollm2", "keep_alive": "9" * 400 + "h"}))[
            1
        ]
        self.assertEqual(error["error"]["param"], "keep_alive")

    def test_bodies_refused_before_a_runner_starts(self) -> None:
        """The client mistakes llama-server answered with a 500, and the JSON it choked on."""
        self.make(SchedulerConfig(), max_request_bytes=10_000)
        self.install()
        message = {"role": "user", "content": "hi"}
        for body, param in [
            ({**CHAT_BODY, "messages": [{"role": 5, "content": "hi"}]}, "messages[0].role"),
            (
                b'{"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
                None,
            ),
            ({**CHAT_BODY, "messages": []}, "messages"),
            ({**CHAT_BODY, "messages": ["hi"]}, "messages[0]"),
            ({**CHAT_BODY, "messages": [{**message, "content": 5}]}, "messages[0].content"),
            (
                {**CHAT_BODY, "messages": [{**message, "content": [{"type": "input_audio"}]}]},
                "messages[0].content[0].type",
            ),
            (
                {**CHAT_BODY, "messages": [{**message, "content": [{"type": "image_url"}]}]},
                "messages[0].content[0].image_url",
            ),
            ({**CHAT_BODY, "temperature": 3}, "temperature"),
            ({**CHAT_BODY, "max_tokens": -1}, "max_tokens"),
            ({**CHAT_BODY, "max_tokens": 1.5}, "max_tokens"),
            ({**CHAT_BODY, "stop": [1]}, "stop[0]"),
            ({**CHAT_BODY, "stream": "yes"}, "stream"),
            (b'{"model": "smollm2", "model": "other", "messages": []}', "model"),
            (b'{"model": "smollm2", "x": ' + b"[" * 1000 + b"]" * 1000 + b"}", None),
            (b'{"model": "smollm2", "x": ' + b"[" * 65 + b"]" * 65 + b"}", None),
        ]:
            code, answer, _ = self.answer(self.request("POST", CHAT, body))
            self.assertEqual(code, 400, (body, answer))
            self.assertEqual(answer["error"].get("param"), param, answer)
        self.assertEqual(self.spawn.processes, [], "no runner was started for a bad request")

    def test_unload(self) -> None:
        self.install()
        self.request("POST", CHAT, {"model": "smollm2"}, headers={"X-Preload-Only": "true"})
        self.spawn.processes[0].ready.callback(None)
        code, body, _ = self.answer(self.request("POST", f"{BASE}/engines/unload", {"models": ["smollm2"]}))
        self.assertEqual((code, body), (200, {"unloaded_runners": 1}))
        self.assertEqual(self.spawn.processes[0].stops, 1)

    def test_configure(self) -> None:
        self.install()
        url = f"{BASE}/engines/llama.cpp/_configure"
        body = {
            "model": "smollm2",
            "context-size": 2048,
            "runtime-flags": ["--temp", "0.2"],
            "keep_alive": "1m",
        }
        self.assertEqual(self.answer(self.request("POST", url, body))[0], 200)
        self.request("POST", CHAT, {"model": "smollm2"}, headers={"X-Preload-Only": "true"})
        key = next(iter(self.scheduler.loader.runners))
        runner = self.scheduler.loader.runners[key]
        self.assertEqual(runner.request.settings.context_size, 2048)
        self.assertEqual(runner.request.settings.flags, ("--temp", "0.2"))
        self.assertEqual(runner.request.keep_alive, 60)
        self.assertError(
            self.request("POST", url, {"model": "smollm2", "runtime-flags": ["--model", "/etc/passwd"]}),
            400,
            "--model",
        )
        for wrong in [True, 0, -1, 1.5, "2048", 2**40]:
            self.assertError(
                self.request("POST", url, {"model": "smollm2", "context_size": wrong}), 400, "context_size"
            )

    def test_configure_empty_flags_clear(self) -> None:
        self.install()
        url = f"{BASE}/engines/_configure"
        self.answer(self.request("POST", url, {"model": "smollm2", "runtime_flags": ["--temp", "0.2"]}))
        code, body, _ = self.answer(self.request("POST", url, {"model": "smollm2", "runtime_flags": []}))
        self.assertEqual((code, body["status"]), (200, "configured"))
        _, body, _ = self.answer(self.request("GET", f"{url}?model=smollm2"))
        self.assertEqual(body["runtime_flags"], [])

    def test_configure_a_draft_model(self) -> None:
        self.install()
        self.store.models["ai/draft:latest"] = model("ai/draft:latest", "d" * 64)
        url = f"{BASE}/engines/_configure"
        body = {"model": "smollm2", "speculative": {"draft_model": "ai/other"}}
        self.assertError(self.request("POST", url, body), 404, "draft model ai/other is not in the store")
        body = {
            "model": "smollm2",
            "speculative": {"draft_model": "draft"},
            "runtime-flags": ["--spec-draft-n-max", "8"],
        }
        self.assertEqual(self.answer(self.request("POST", url, body))[0], 200)
        shown = self.answer(self.request("GET", f"{url}?model=smollm2"))[1]
        self.assertEqual(shown["speculative"], {"draft_model": "draft"})
        self.request("POST", CHAT, {"model": "smollm2"}, headers={"X-Preload-Only": "true"})
        (runner,) = self.scheduler.loader.runners.values()
        self.assertEqual(runner.request.settings.draft, self.store.models["ai/draft:latest"])
        self.assertError(
            self.request("POST", url, {"model": "smollm2", "speculative": "draft"}), 400, "object"
        )

    def test_configure_raw_flags(self) -> None:
        self.install()
        body = {"model": "smollm2", "raw-runtime-flags": "--temp 0.2 --top-k 5"}
        self.assertEqual(self.answer(self.request("POST", f"{BASE}/engines/_configure", body))[0], 200)
        self.request("POST", CHAT, {"model": "smollm2"}, headers={"X-Preload-Only": "true"})
        (runner,) = self.scheduler.loader.runners.values()
        self.assertEqual(runner.request.settings.flags, ("--temp", "0.2", "--top-k", "5"))

    def test_configure_busy_runner(self) -> None:
        self.make(SchedulerConfig(parallel=1))
        self.install()
        url = f"{BASE}/engines/_configure"
        self.answer(self.request("POST", url, {"model": "smollm2", "context-size": 1024}))
        d = acquire(self.scheduler, self.store, None, "smollm2", "completion")
        self.spawn.processes[-1].ready.callback(None)
        self.successResultOf(d)
        code, body, _ = self.answer(self.request("POST", url, {"model": "smollm2", "context-size": 1024}))
        self.assertEqual((code, body["status"]), (200, "unchanged"), "the same settings are a no-op")
        code, body, _ = self.answer(self.request("POST", url, {"model": "smollm2", "keep_alive": "1h"}))
        self.assertEqual((code, body["status"]), (200, "configured"), "keep-alive needs no restart")
        self.assertEqual(
            self.scheduler.loader.runners[next(iter(self.scheduler.loader.runners))].keep_alive,
            3600,
        )
        self.assertError(self.request("POST", url, {"model": "smollm2", "context-size": 2048}), 409, "idle")
        self.assertEqual(self.spawn.processes[0].stops, 0)

    def test_configure_reloads_an_idle_runner(self) -> None:
        self.install()
        self.request("POST", CHAT, {"model": "smollm2"}, headers={"X-Preload-Only": "true"})
        self.spawn.processes[0].ready.callback(None)
        url = f"{BASE}/engines/_configure"
        code, body, _ = self.answer(self.request("POST", url, {"model": "smollm2", "context-size": 512}))
        self.assertEqual((code, body["status"]), (200, "configured"))
        self.assertEqual(self.spawn.processes[0].stops, 1)
        (runner,) = self.scheduler.loader.runners.values()
        self.assertEqual(runner.request.settings.context_size, 512, "loaded again with the new size")
        code, body, _ = self.answer(self.request("GET", f"{url}?model=smollm2"))
        self.assertEqual(
            body,
            {
                "backend": "llama.cpp",
                "model": "ai/smollm2:latest",
                "context_size": 512,
                "context_size_in_force": 512,
                "warning": None,
                "runtime_flags": [],
                "keep_alive": 300,
                "pinned": False,
                "speculative": {"draft_model": None},
            },
        )
        self.assertError(self.request("GET", f"{url}?model=nothing"), 404)
        self.assertError(self.request("GET", url), 400, "model")

    def test_a_context_above_the_models_is_named(self) -> None:
        """_configure's answer, GET _configure, ps and the log name the context in force."""
        self.backend.trained = 4096
        self.install()
        url = f"{BASE}/engines/_configure"
        events: list[dict[str, Any]] = []
        globalLogPublisher.addObserver(events.append)
        self.addCleanup(globalLogPublisher.removeObserver, events.append)
        code, body, _ = self.answer(self.request("POST", url, {"model": "smollm2", "context-size": 32768}))
        self.assertEqual((code, body["status"], body["context_size"]), (200, "configured", 4096))
        note = "context_size 32768 for ai/smollm2:latest is more than the model will give"
        self.assertIn(note, body["warning"])
        self.assertIn("at most 4096 tokens", body["warning"])
        code, body, _ = self.answer(self.request("GET", f"{url}?model=smollm2"))
        self.assertEqual((body["context_size"], body["context_size_in_force"]), (32768, 4096))
        self.request("POST", CHAT, {"model": "smollm2"}, headers={"X-Preload-Only": "true"})
        self.spawn.processes[0].ready.callback(None)
        (runner,) = self.answer(self.request("GET", f"{BASE}/engines/ps"))[1]
        self.assertEqual((runner["context_size"], runner["context_size_configured"]), (4096, 32768))
        self.assertIn(note, runner["warning"])
        self.assertIn(note, "\n".join(formatEvent(event) for event in events))
        code, body, _ = self.answer(self.request("POST", url, {"model": "smollm2", "context-size": 2048}))
        self.assertNotIn("warning", body, "2048 fits in 4096")

    def test_metrics(self) -> None:
        _, body, _ = self.answer(self.request("GET", f"{BASE}/metrics"))
        self.assertIn(b"mrunner_queue_waiting 0.0", body)
        self.install()
        self.request("POST", CHAT, {"model": "smollm2"}, headers={"X-Preload-Only": "true"})
        _, body, _ = self.answer(self.request("GET", f"{BASE}/metrics"))
        self.assertIn(b'state="loading"} 1.0', body)
        self.spawn.processes[0].ready.callback(None)
        _, body, _ = self.answer(self.request("GET", f"{BASE}/metrics"))
        self.assertIn(b'state="ready"} 1.0', body)

    def test_ps_shows_pins_and_stale_runners(self) -> None:
        self.install()
        d = self.request("POST", CHAT, {"model": "smollm2"}, headers={"X-Preload-Only": "true"})
        self.spawn.processes[0].ready.callback(None)
        self.answer(d)
        url = f"{BASE}/engines/_configure"
        code, body, _ = self.answer(self.request("POST", url, {"model": "smollm2", "pinned": True}))
        self.assertEqual((code, body["status"]), (200, "configured"))
        (runner,) = self.answer(self.request("GET", f"{BASE}/engines/ps"))[1]
        self.assertEqual((runner["pinned"], runner["keep_alive"], runner["expires_at"]), (True, None, None))
        self.assertFalse(runner["stale"])
        self.assertError(self.request("POST", url, {"model": "smollm2", "pinned": "yes"}), 400, "pinned")

    def test_ps_survives_a_keep_alive_no_clock_holds(self) -> None:
        self.install()
        for keep_alive in (1e12, 1e308):
            d = self.request(
                "POST",
                CHAT,
                {"model": "smollm2", "keep_alive": keep_alive},
                headers={"X-Preload-Only": "true"},
            )
            if len(self.spawn.processes) == 1 and not self.spawn.processes[0].ready.called:
                self.spawn.processes[0].ready.callback(None)
            self.assertEqual(self.answer(d)[0], 200)
            code, ps, _ = self.answer(self.request("GET", f"{BASE}/engines/ps"))
            self.assertEqual(code, 200)
            self.assertIsNone(ps[0]["expires_at"], "no calendar holds it: shown as never")
            self.assertEqual(self.answer(self.request("GET", f"{BASE}/metrics"))[0], 200)

    def test_ready_and_reload_without_a_reloader(self) -> None:
        code, body, _ = self.answer(self.request("GET", f"{BASE}/ready"))
        not_ready = {"ready": False, "draining": False, "preloads": [], "failed": []}
        self.assertEqual((code, body), (503, not_ready))
        self.install()
        code, body, _ = self.answer(self.request("GET", f"{BASE}/ready"))
        self.assertEqual((code, body), (200, {**not_ready, "ready": True}))
        self.assertError(self.request("POST", f"{BASE}/engines/_reload"), 400, "without a configuration")

    def test_drain(self) -> None:
        """A drained node finishes what it serves, refuses the rest with a 503 to retry elsewhere, and is
        not ready."""
        self.install()
        d = self.request("POST", CHAT, {"model": "smollm2"}, headers={"X-Preload-Only": "true"})
        self.spawn.processes[0].ready.callback(None)
        self.assertEqual(self.answer(d)[0], 200)
        held = self.successResultOf(acquire(self.scheduler, self.store, None, "smollm2", "completion"))
        code, body, _ = self.answer(self.request("POST", f"{BASE}/engines/_drain"))
        self.assertEqual((code, body), (200, {"draining": True, "in_flight": 1}))
        waiting = self.request("POST", f"{BASE}/engines/_drain?wait=true")
        self.assertNoResult(waiting)
        headers = self.assertError(self.request("POST", CHAT, CHAT_BODY), 503, "draining")
        self.assertEqual(headers.getRawHeaders(b"retry-after"), [b"1"])
        missing = {"model": "ai/nothing-here", "messages": CHAT_BODY["messages"]}
        self.assertError(self.request("POST", CHAT, missing), 503, "draining")  # not 404: ask elsewhere
        code, body, _ = self.answer(self.request("GET", f"{BASE}/ready"))
        self.assertEqual((code, body["ready"], body["draining"]), (503, False, True))
        held.release()
        self.assertEqual(self.answer(waiting)[:2], (200, {"draining": True, "in_flight": 0}))
        self.assertEqual(self.spawn.processes[0].stops, 0, "its runners stay until the daemon stops")


class HeaderTests(SynchronousTestCase):
    def test_hop_by_hop_fields_are_not_forwarded(self) -> None:
        headers = Headers(
            {
                b"Connection": [b"keep-alive, X-Trace"],
                b"X-Trace": [b"1"],
                b"Transfer-Encoding": [b"chunked"],
                b"Content-Type": [b"application/json"],
                b"X-Request-Id": [b"k"],
            }
        )
        kept = dict(forwarded_headers(headers).getAllRawHeaders())
        self.assertEqual(kept, {b"Content-Type": [b"application/json"], b"X-Request-Id": [b"k"]})


class PageRouteTests(SynchronousTestCase):
    """The page's files and its overview; the browser test walks the page itself (test_page)."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.clock.advance(1000)
        backends, store = {"llama.cpp": FakeBackend()}, FakeStore()
        self.scheduler = Scheduler(self.clock, Config(), backends, store, FakeSpawner().start_runner)
        groups = daemon_groups(self.scheduler, store, self.clock, backends, Path(self.mktemp()))
        self.http = StubTreq(Routes(groups))

    def get(self, path: str, **headers: str) -> tuple[int, Headers, bytes]:
        response = self.successResultOf(self.http.get(BASE + path, headers=headers, allow_redirects=False))
        return response.code, response.headers, self.successResultOf(response.content())

    def test_browsers_go_to_the_page_api_clients_do_not(self) -> None:
        code, headers, _ = self.get("/", Accept="text/html,application/xhtml+xml,*/*;q=0.8")
        self.assertEqual((code, headers.getRawHeaders("location")), (302, ["/ui"]))
        self.assertEqual(self.get("/")[::2], (200, b"mrunner is running"))
        self.assertEqual(self.get("/", Accept="application/json")[::2], (200, b"mrunner is running"))

    def test_files_with_their_types_and_a_policy_that_keeps_them_here(self) -> None:
        weight = 0
        for path, kind in [
            ("/ui", "text/html"),
            ("/ui/app.js", "text/javascript"),
            ("/ui/style.css", "text/css"),
        ]:
            code, headers, body = self.get(path)
            self.assertEqual(code, 200)
            self.assertTrue(headers.getRawHeaders("content-type")[0].startswith(kind))
            self.assertIn("connect-src 'self'", headers.getRawHeaders("content-security-policy")[0])
            weight += len(body)
        self.assertLess(weight, 100 * 1024)
        self.assertEqual(self.get("/ui/")[0], 200)
        self.assertEqual(self.get("/ui/secret.txt")[0], 404)
        self.assertEqual(self.get("/ui/..%2Fapi%2Fui.py")[0], 404)

    def test_overview(self) -> None:
        code, _, body = self.get("/engines/overview")
        self.assertEqual(code, 200)
        overview = json.loads(body)
        self.assertEqual(overview["runners"], [])
        self.assertEqual((overview["queue"], overview["now"]), (0, 1000))
        self.assertEqual(overview["memory_budget"], Config().scheduler.memory_budget)
        self.assertEqual(overview["waiting"], [])

    def test_overview_shows_each_models_prompt_cache_counts(self) -> None:
        self.assertEqual(json.loads(self.get("/engines/overview")[2])["cache"], {}, "no cache: none")
        backends, store = {"llama.cpp": FakeBackend()}, FakeStore()
        counts = {"ai/a:latest": Counts(hits=3, misses=1, restores=2, saves=4, restored_tokens=900)}
        groups = daemon_groups(
            self.scheduler, store, self.clock, backends, Path(self.mktemp()), cache_counts=counts
        )
        self.http = StubTreq(Routes(groups))
        shown = json.loads(self.get("/engines/overview")[2])["cache"]
        self.assertEqual(
            shown, {"ai/a:latest": {"hits": 3, "misses": 1, "restores": 2, "failed_restores": 0, "saves": 4}}
        )

    def test_overview_shows_each_models_queue(self) -> None:
        self.scheduler.loader.acquire(request("a"))
        self.clock.advance(2)
        self.scheduler.loader.acquire(request("a"))
        overview = json.loads(self.get("/engines/overview")[2])
        self.assertEqual(overview["waiting"], [{"model": "ai/a:latest", "waiting": 2, "oldest_wait": 2}])
