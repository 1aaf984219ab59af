"""Token budgets against an attacker, for real (issue 35 A2, A3, A4): mrunner → llama-server (tiny model).

Streams cut after a few events, requests without a length or with llama-server's own ``n_predict``,
a burst past a daily budget, and a cached prompt sent twice on every route: what each key is
charged (``/engines/usage``) and what its client is told.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import httpx
from twisted.internet.threads import deferToThread

from tests.support.daemon import eventually, http
from tests.support.llamacpp_cases import TINY, LlamaCppTestCase

#: (key, route, body) of each route's stream, none of which says how long it may be (Anthropic's
#: field is required: it asks for more than the budget has left).
HI = [{"role": "user", "content": "hi"}]
STREAMS = [
    ("chat", "/v1/chat/completions", {"messages": HI, "stream": True}),
    ("text", "/v1/completions", {"prompt": "once upon a time", "stream": True}),
    ("ollama", "/api/chat", {"messages": HI}),
    ("responses", "/v1/responses", {"input": "hi", "stream": True}),
    ("claude", "/v1/messages", {"messages": HI, "max_tokens": 1500, "stream": True}),
]
BUDGET = 2000
KEYS = '[http]\nadmin_api_keys = ["admin-key"]\n' + "".join(
    f'[keys.{name}]\nkey = "{name}-key"\ntokens_per_day = {BUDGET}\n' for name, _, _ in STREAMS
)
KEYS += '[keys.small]\nkey = "small-key"\ntokens_per_day = 500\n[keys.root]\nkey = "root-key"\nadmin = true\n'
KEYS += "".join(f'[keys.{name}-free]\nkey = "{name}-free-key"\n' for name, _, _ in STREAMS)
#: A prompt of a few hundred tokens, the same each time: after its first sending it is read from the cache.
LONG = " ".join(["the cat sat on the mat and looked at the dog"] * 30)
CACHED = [
    ("chat", "/v1/chat/completions", {"messages": [{"role": "user", "content": LONG}], "max_tokens": 2}),
    ("text", "/v1/completions", {"prompt": LONG, "max_tokens": 2}),
    ("ollama", "/api/chat", {"messages": [{"role": "user", "content": LONG}], "options": {"num_predict": 2}}),
    ("responses", "/v1/responses", {"input": LONG, "max_output_tokens": 2}),
    ("claude", "/v1/messages", {"messages": [{"role": "user", "content": LONG}], "max_tokens": 2}),
]


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}", "Connection": "close"}


class HostileTokenTests(LlamaCppTestCase):
    timeout = 240

    async def begin(self) -> None:
        await self.start(KEYS)
        await self.tiny()

    async def usage(self, key: str) -> tuple[int, int]:
        response = await http.get(
            self.daemon.url + "/engines/usage", params={"key": key}, headers=auth("root-key")
        )
        rows = json.loads(await response.text())["data"]
        return sum(r["prompt_tokens"] for r in rows), sum(r["completion_tokens"] for r in rows)

    async def settled(self) -> None:
        """Every admitted request has ended (its ticket charged, its reservation let go)."""
        allowances = self.daemon.teams._allowances
        await eventually(lambda: all(a.in_flight == 0 for a in allowances.values()), 30)

    def read(self, path: str, key: str, body: dict[str, Any], lines: int | None) -> list[bytes]:
        """Post C{body}, read C{lines} non-empty lines of the answer (all: None), then hang up."""
        got: list[bytes] = []
        with httpx.stream(
            "POST", self.daemon.url + path, json={"model": TINY, **body}, headers=auth(key), timeout=60
        ) as response:
            assert response.status_code == 200, response.read()
            for line in response.iter_lines():
                if line.strip():
                    got.append(line.encode())
                if lines is not None and len(got) >= lines:
                    break
        return got

    async def test_cut_streams_are_charged_and_a_length_left_out_is_the_budget_left(self) -> None:
        """A2: a stream cut after 40 lines is charged its prompt and what was made (it was 0), on every
        route; read to its end, a stream that gave no length stops within the budget."""
        await self.begin()
        for name, path, body in STREAMS:
            await deferToThread(self.read, path, f"{name}-key", body, 40)
            await self.settled()
            prompt, completion = await self.usage(name)
            self.assertGreater(prompt, 0, name)
            self.assertGreaterEqual(completion, 15, f"{name}: about one token per event read")
            self.assertLessEqual(completion, BUDGET, name)

        lines = await deferToThread(self.read, "/v1/chat/completions", "small-key", STREAMS[0][2], None)
        final = json.loads(lines[-2].removeprefix(b"data: "))
        self.assertEqual(final["choices"][0]["finish_reason"], "length", "the runner stopped at the cap")
        self.assertEqual(final["timings"]["predicted_n"], 500, "the whole budget, no more")
        await self.settled()
        response = await http.post(
            self.daemon.url + "/v1/chat/completions",
            json={"model": TINY, "messages": HI, "max_tokens": 1},
            headers=auth("small-key"),
        )
        self.assertEqual(response.code, 429, "the budget is spent")

    async def test_the_length_the_runner_obeys_is_reserved(self) -> None:
        """A3: n_predict is the length checked and imposed; 20 requests at once share 500 tokens."""
        await self.begin()
        url = self.daemon.url + "/v1/chat/completions"
        response = await http.post(
            url,
            json={"model": TINY, "messages": HI, "max_tokens": 1, "n_predict": 1000},
            headers=auth("small-key"),
        )
        self.assertEqual(response.code, 400)
        self.assertEqual(json.loads(await response.text())["error"]["code"], "tokens_over_budget")
        response = await http.post(
            self.daemon.url + "/api/chat",
            json={"model": TINY, "messages": HI, "max_tokens": 3, "stream": False},
            headers=auth("ollama-key"),
        )
        answer = json.loads(await response.text())
        self.assertLessEqual(
            answer["eval_count"], BUDGET, "not Ollama's length field, but capped all the same"
        )

        codes: list[int] = []
        lock = threading.Lock()

        def one() -> None:
            answer = httpx.post(
                url,
                json={"model": TINY, "messages": HI, "max_tokens": 100},
                headers=auth("small-key"),
                timeout=60,
            )
            with lock:
                codes.append(answer.status_code)

        threads = [threading.Thread(target=one) for _ in range(20)]
        for thread in threads:
            thread.start()
        await deferToThread(lambda: [thread.join() for thread in threads])
        await self.settled()
        self.assertEqual(sorted(set(codes)), [200, 429])
        self.assertLessEqual(codes.count(200), 5)
        _, completion = await self.usage("small")
        self.assertLessEqual(completion, 500, "what was generated stayed within the day's budget")

    async def test_a_cached_prompt_is_counted_whole_on_every_route(self) -> None:
        """A4: the same long prompt, streamed and not, twice on each route: charged its whole length each
        time, as the client is told (cached tokens apart where the API has a field for them)."""
        await self.begin()
        for name, path, body in CACHED:
            told = []
            for stream in (False, True, False, True):
                lines = await deferToThread(
                    self.read, path, f"{name}-free-key", {**body, "stream": stream}, None
                )
                told.append(client_count(lines))
            await self.settled()
            prompt, _ = await self.usage(f"{name}-free")
            self.assertEqual(len(set(told)), 1, f"{name}: the client was told {told}")
            self.assertGreater(told[0], 300, name)
            self.assertEqual(prompt, sum(told), f"{name}: charged as told")


def client_count(lines: list[bytes]) -> int:
    """The prompt tokens the client was told, in the API's own fields (the last said)."""
    said = 0
    for line in lines:
        text = line.removeprefix(b"data: ")
        if not text.startswith(b"{"):
            continue
        value = json.loads(text)
        usage = (
            value.get("usage")
            or (value.get("response") or {}).get("usage")
            or (value.get("message") or {}).get("usage")
        )
        if "prompt_eval_count" in value:
            said = value["prompt_eval_count"]
        elif isinstance(usage, dict) and "prompt_tokens" in usage:
            said = usage["prompt_tokens"]
        elif isinstance(usage, dict) and "input_tokens" in usage:
            said = usage["input_tokens"] + usage.get("cache_read_input_tokens", 0)
        elif "timings" in value:
            said = value["timings"]["prompt_n"] + value["timings"]["cache_n"]
    return said
