"""Issue 22's API rows, as a hostile client sends them, to a daemon with normal and admin keys.

Each case is a probe of the second hostile round (H2, M2, M4-M7) kept as a
test: mrunner with real processes (tests/support/runner_program.py as the runner),
spoken to over HTTP and, where a client would, with the official clients.
Every refusal is a 4xx in the API's own error shape, and no runner sees it.
"""

from __future__ import annotations

import json
from typing import Any

import ollama
import openai
from twisted.internet.threads import deferToThread

from mrunner.api.door.callers import MAX_KEEP_ALIVE
from tests.support.daemon_cases import MODEL, CompatDaemonTestCase
from tests.support.keyed import Keyed
from tests.support.llamacpp_cases import TINY, LlamaCppTestCase
from tests.support.parsers import with_twisted_heads

K1, K2, ROOT = "key-one", "key-two", "key-root"
KEYS = f'[http]\napi_keys = ["{K1}", "{K2}"]\nadmin_api_keys = ["{ROOT}"]\n'
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
# Each API's inference routes, a body it takes, and the path of a string field in it.
ROUTES: list[tuple[str, dict[str, Any], tuple[Any, ...]]] = [
    ("/v1/chat/completions", CHAT, ("messages", 0, "content")),
    ("/v1/completions", {"model": MODEL, "prompt": "hi"}, ("prompt",)),
    ("/v1/embeddings", {"model": MODEL, "input": "hi"}, ("input",)),
    ("/anthropic/v1/messages", {**CHAT, "max_tokens": 3}, ("messages", 0, "content")),
    ("/v1/responses", {"model": MODEL, "input": "hi"}, ("input",)),
    (
        "/api/chat",
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
        ("messages", 0, "content"),
    ),
    ("/api/generate", {"model": MODEL, "prompt": "hi"}, ("prompt",)),
    ("/api/embed", {"model": MODEL, "input": "hi"}, ("input",)),
]


def _with(body: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    copy = json.loads(json.dumps(body))
    where = copy
    for step in path[:-1]:
        where = where[step]
    where[path[-1]] = value
    return copy


def _message(path: str, answer: Any) -> str:
    """The error's message in the shape of the API at C{path}."""
    if path.startswith("/api/"):
        return str(answer["error"])
    if path.startswith("/anthropic/"):
        assert answer["type"] == "error", answer
    return str(answer["error"]["message"])


class HostileAPITests(Keyed, CompatDaemonTestCase):
    async def start(self, text: str = "") -> None:
        await super().start(KEYS + text)

    def runner_saw(self) -> int:
        path = self.home / "requests"
        return len(path.read_text().splitlines()) if path.exists() else 0

    async def configured(self) -> dict[str, Any]:
        code, answer = await self.ask("GET", f"/engines/_configure?model={MODEL}", ROOT)
        self.assertEqual(code, 200, answer)
        return dict(answer)

    # H2

    async def test_normal_key_num_ctx_changes_nothing_for_others(self) -> None:
        """A normal key's num_ctx (within the caps) is served and configures nothing; past them (2**31,
        10**30, 10**400) it is a 400 naming options.num_ctx, and every key is served after."""
        await self.start()
        before = await self.configured()
        load = {"model": MODEL, "messages": [], "options": {"num_ctx": 1024}}
        code, answer = await self.ask("POST", "/api/chat", K1, load)
        self.assertEqual((code, answer.get("done_reason")), (200, "load"), answer)
        self.assertEqual(await self.configured(), before)
        for size in [b"2147483648", b"1" + b"0" * 30, b"1" + b"0" * 400, b"0", b"-1", b"1.5", b'"big"']:
            body = b'{"model": "%s", "messages": [], "options": {"num_ctx": %s}}' % (MODEL.encode(), size)
            code, answer = await self.ask("POST", "/api/chat", K1, body)
            self.assertEqual(code, 400, (size, answer))
            self.assertIn("options.num_ctx", answer["error"])
        self.assertEqual(await self.configured(), before)
        for key in (K2, ROOT):
            code, answer = await self.ask("POST", "/v1/chat/completions", key, CHAT)
            self.assertEqual(code, 200, answer)
        # An admin's num_ctx still sets the model's context, as _configure does.
        code, _ = await self.ask("POST", "/api/chat", ROOT, load)
        self.assertEqual((code, (await self.configured())["context_size"]), (200, 1024))

    async def test_normal_key_cannot_keep_a_model_for_ever(self) -> None:
        """keep_alive -1 (or a year) from a normal key keeps the model MAX_KEEP_ALIVE; an admin's pins it."""
        await self.start()
        client = ollama.Client(
            host=self.daemon.url, headers={"Authorization": f"Bearer {K1}", "Connection": "close"}
        )
        for keep in (-1, "8760h"):
            await deferToThread(client.chat, model=MODEL, messages=[], keep_alive=keep)
            _, (runner,) = await self.ask("GET", "/engines/ps", ROOT)
            self.assertEqual(runner["keep_alive"], MAX_KEEP_ALIVE)
        await self.ask("POST", "/api/chat", ROOT, {"model": MODEL, "messages": [], "keep_alive": -1})
        _, (runner,) = await self.ask("GET", "/engines/ps", ROOT)
        self.assertIsNone(runner["keep_alive"])

    async def test_ollama_options_out_of_range(self) -> None:
        await self.start()
        for option, value in [("num_predict", 2**40), ("top_k", -1), ("seed", 10**30), ("temperature", "x")]:
            body = {**ROUTES[5][1], "options": {option: value}}
            code, answer = await self.ask("POST", "/api/chat", K1, body)
            self.assertEqual(code, 400, (option, answer))
            self.assertIn(f"options.{option}", answer["error"])
        self.assertEqual(self.runner_saw(), 0)

    async def test_huge_numbers_on_every_api(self) -> None:
        """10**400 in any numeric field, known or not, is a 400 naming it on every API, never a 5xx."""
        await self.start()
        huge = b"1" + b"0" * 400
        for path, body, _ in ROUTES:
            for field in (b"max_tokens", b"top_k", b"max_output_tokens"):
                data = json.dumps(body).encode()[:-1] + b', "%s": %s}' % (field, huge)
                code, answer = await self.ask("POST", path, K1, data)
                self.assertEqual(code, 400, (path, field, answer))
                self.assertIn(field.decode(), _message(path, answer))
        self.assertEqual(self.runner_saw(), 0)

    # M4

    async def test_text_no_runner_can_read(self) -> None:
        """Lone surrogates (escaped, raw, in a value or an unknown key) and UTF-16/32 bodies: a 400
        naming the field, in each API's shape, before any runner sees them."""
        await self.start()
        for path, body, field in ROUTES:
            name = ".".join(str(step) for step in field).replace(".0.", "[0].")
            for lone in ("\ud800", "a\udc00b"):
                code, answer = await self.ask("POST", path, K1, json.dumps(_with(body, field, lone)).encode())
                self.assertEqual(code, 400, (path, lone, answer))
                self.assertIn(f"'{name}'", _message(path, answer))
            raw = json.dumps(_with(body, field, "RAW")).encode().replace(b"RAW", b"\xed\xa0\x80")
            code, answer = await self.ask("POST", path, K1, raw)
            self.assertEqual(code, 400, (path, answer))
            self.assertIn(f"'{name}'", _message(path, answer))
            unknown = json.dumps({**body, "x\ud800": 1}).encode()
            code, answer = await self.ask("POST", path, K1, unknown)
            self.assertEqual(code, 400, (path, answer))
            self.assertIn("surrogate", _message(path, answer))
            for encoding in ("utf-16", "utf-16-le", "utf-32"):
                code, answer = await self.ask("POST", path, K1, json.dumps(body).encode(encoding))
                self.assertEqual(code, 400, (path, encoding, answer))
        self.assertEqual(self.runner_saw(), 0)

    # M5, M7

    async def test_responses_belong_to_their_key(self) -> None:
        """k2 cannot read, list the items of, continue or delete k1's response (404, as for none);
        an admin can read it; k1 can do all of it. Through the official client."""
        await self.start()

        def client(key: str) -> openai.OpenAI:
            return openai.OpenAI(
                base_url=self.daemon.url + "/v1",
                api_key=key,
                max_retries=0,
                default_headers={"Connection": "close"},
            )

        one, two = client(K1), client(K2)
        made = await deferToThread(one.responses.create, model=MODEL, input="k1's secret")
        for ask in (
            lambda: two.responses.retrieve(made.id),
            lambda: two.responses.input_items.list(made.id),
            lambda: two.responses.create(model=MODEL, input="more", previous_response_id=made.id),
            lambda: two.responses.delete(made.id),
        ):
            with self.assertRaises(openai.NotFoundError):
                await deferToThread(ask)
        code, answer = await self.ask("GET", f"/v1/responses/{made.id}", ROOT)
        self.assertEqual((code, answer["id"]), (200, made.id))
        items = await deferToThread(one.responses.input_items.list, made.id)
        self.assertEqual(items.data[0].content[0].text, "k1's secret")  # type: ignore[union-attr]
        code, answer = await self.ask("GET", f"/v1/responses/{made.id}/input_items?limit=\u00b2", K1)
        self.assertEqual(code, 400, answer)
        self.assertEqual(answer["error"]["param"], "limit")
        await deferToThread(one.responses.delete, made.id)

    async def test_hostile_response_paths_and_queries(self) -> None:
        """Ids and queries of any bytes, digits that are not ASCII (int('²') was an HTML 500): 4xx."""
        await self.start()
        code, made = await self.ask("POST", "/v1/responses", K1, {"model": MODEL, "input": "x"})
        self.assertEqual(code, 200, made)
        items = f"/v1/responses/{made['id']}/input_items"
        for path, status in [
            (f"{items}?limit=%C2%B2", 400),
            (f"{items}?limit=%D9%A3", 400),  # an Arabic-Indic three
            (f"{items}?limit=0", 400),
            (f"{items}?limit=101", 400),
            (f"{items}?limit=1" + "0" * 5000, 400),
            (f"{items}?order=%FF", 400),
            (f"{items}?after=%ED%A0%80&limit=3", 200),
            ("/v1/responses/%ED%A0%80", 400),  # not UTF-8 once decoded
            ("/v1/responses/%FF/input_items", 400),
            ("/v1/responses/" + "x" * 5000, 404),
        ]:
            code, answer = await self.ask("GET", path, K1)
            self.assertEqual(code, status, (path, answer))
            self.assertIsInstance(answer, dict, path)  # JSON, never twisted's HTML page

    # M2, M6

    async def test_responses_fields_llama_server_cannot_take(self) -> None:
        await self.start()
        pairs = {f"k{i}": "v" for i in range(17)}
        call = {"type": "function_call", "call_id": 7, "name": "f", "arguments": "{}"}
        output = {"type": "function_call_output", "call_id": 7, "output": "x"}
        image = {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}
        for field, value, param in [
            ("metadata", pairs, "metadata"),
            ("metadata", {"k" * 65: "v"}, "metadata.kkk"),
            ("metadata", {"k": "v" * 513}, "metadata.k"),
            ("metadata", {"k": 1}, "metadata.k"),
            ("input", [call], "input[0].call_id"),
            ("input", [output], "input[0].call_id"),
            ("tools", [{"type": "function", "parameters": {}}], "tools[0].name"),
            ("input", [{"role": "user", "content": [image]}], "model"),
        ]:
            code, answer = await self.ask(
                "POST", "/v1/responses", K1, {"model": MODEL, "input": "x", field: value}
            )
            self.assertEqual(code, 400, (field, value, answer))
            self.assertTrue(answer["error"]["param"].startswith(param), answer)
        code, answer = await self.ask(
            "POST",
            "/v1/responses",
            K1,
            {"model": MODEL, "input": "x", "metadata": {f"k{i}": "v" * 512 for i in range(16)}},
        )
        self.assertEqual(code, 200, answer)

    async def test_anthropic_fields_llama_server_cannot_take(self) -> None:
        await self.start()
        image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
        for content in ([{"type": "text", "text": 5}], [image]):
            body = {**CHAT, "messages": [{"role": "user", "content": content}]}
            code, answer = await self.ask("POST", "/anthropic/v1/messages", K1, body)
            self.assertEqual(code, 400, (content, answer))
            self.assertEqual(answer["type"], "error")
        self.assertEqual(self.runner_saw(), 0)


class RealRunnerTests(Keyed, LlamaCppTestCase):
    """The probes with llama-server itself loaded behind mrunner: each was its 500 (or mrunner's
    502) before issue 22; now each is a 400 and the runner serves every key as before."""

    async def test_probes_never_reach_llama_server(self) -> None:
        await self.start(KEYS)
        await self.tiny()
        chat = {"model": TINY, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        code, answer = await self.ask("POST", "/v1/chat/completions", K1, chat)
        self.assertEqual(code, 200, answer)
        image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
        call = {"type": "function_call", "call_id": 7, "name": "f", "arguments": "{}"}
        probes: list[tuple[str, bytes | dict[str, Any]]] = [
            ("/v1/chat/completions", json.dumps(_with(chat, ("messages", 0, "content"), "\ud800")).encode()),
            ("/v1/chat/completions", json.dumps(chat).encode("utf-16")),
            ("/v1/chat/completions", json.dumps({**chat, "x\udc00": 1}).encode()),
            (
                "/anthropic/v1/messages",
                _with(chat, ("messages", 0, "content"), [{"type": "text", "text": 5}]),
            ),
            ("/anthropic/v1/messages", _with(chat, ("messages", 0, "content"), [image])),
            (
                "/anthropic/v1/messages",
                json.dumps(_with(chat, ("messages", 0, "content"), "\udc00")).encode(),
            ),
            ("/v1/responses", {"model": TINY, "input": [call]}),
            ("/v1/responses", {"model": TINY, "input": "x", "tools": [{"type": "function"}]}),
            (
                "/v1/responses",
                {
                    "model": TINY,
                    "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:,"}]}],
                },
            ),
            ("/v1/responses", json.dumps({"model": TINY, "input": "\ud800"}).encode()),
            (
                "/api/chat",
                b'{"model": "%s", "messages": [], "options": {"num_ctx": 1%s}}' % (TINY.encode(), b"0" * 400),
            ),
            (
                "/api/chat",
                json.dumps({"model": TINY, "messages": [{"role": "user", "content": "\ud800"}]}).encode(),
            ),
        ]
        for path, body in probes:
            code, answer = await self.ask("POST", path, K1, body)
            self.assertEqual(code, 400, (path, str(body)[:80], answer))
        for key in (K2, ROOT):
            code, answer = await self.ask("POST", "/v1/chat/completions", key, chat)
            self.assertEqual(code, 200, answer)


HostileAPITestsTwistedHeads = with_twisted_heads(HostileAPITests)
