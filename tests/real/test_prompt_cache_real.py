"""The prompt cache with the real llama-server and SmolLM2: a conversation's next turn after its runner
stopped finds its earlier prompt cached; an unrelated conversation finds nothing of it."""

from __future__ import annotations

import json
import os
from typing import Any

import anthropic
from openai import OpenAI
from twisted.internet import reactor
from twisted.internet.defer import ensureDeferred
from twisted.internet.utils import getProcessOutputAndValue

from tests.support.cli_cases import MRUNNER
from tests.support.daemon import InProcessDaemon, eventually, free_port, http, short_home
from tests.support.llamacpp_cases import TINY, LlamaCppTestCase, cached_llama_server, smollm2
from tests.support.terminal import MakeRun, make_run

MODEL = "ai/smollm2"
#: About 1,300 tokens: long enough to be saved, short enough to read on a shared 2-core machine.
TEXT = " ".join(
    f"Note {i}: the {['red', 'green', 'blue'][i % 3]} box holds {i * 7} marbles." for i in range(90)
)


def opening(topic: str) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": "You answer in one short sentence."},
        {"role": "user", "content": f"Read these notes about {topic}:\n{TEXT}\nWhich box is first?"},
    ]


class PromptCacheTests(LlamaCppTestCase):
    timeout = 600

    async def ask(self, messages: list[dict[str, str]], **extra: Any) -> Any:
        return await self.call(
            self.client.chat.completions.create,
            model=MODEL,
            messages=messages,
            temperature=0,
            max_tokens=12,
            extra_body=extra or None,
        )

    keys: dict[str, str] = {}

    async def unload(self) -> None:
        response = await http.post(self.daemon.url + "/engines/unload", json={"all": True}, headers=self.keys)
        self.assertEqual(response.code, 200, await response.text())

    async def metric(self, name: str) -> float:
        response = await http.get(self.daemon.url + "/metrics", headers=self.keys)
        for line in (await response.text()).splitlines():
            if line.startswith(f"mrunner_prompt_cache_{name} "):
                return float(line.split()[1])
        raise AssertionError(f"no mrunner_prompt_cache_{name} in /metrics")

    async def mrunner(self, *args: str) -> str:
        """What the mrunner command prints, run against this daemon."""
        env = {**os.environ, "MRUNNER_HOST": self.daemon.url}
        out, err, code = await getProcessOutputAndValue(MRUNNER, args, env=env, reactor=reactor)
        self.assertEqual(code, 0, err)
        return str(out.decode())

    async def next_turn_is_cached(self, first: Any, messages: list[dict[str, str]]) -> None:
        """The turn after C{first} finds at least 90% of its prompt cached, restored from a saved state."""
        messages += [
            {"role": "assistant", "content": first.choices[0].message.content},
            {"role": "user", "content": "And the last box?"},
        ]
        usage = (await self.ask(messages)).usage
        self.assertGreaterEqual(usage.prompt_tokens_details.cached_tokens, 0.9 * usage.prompt_tokens, usage)
        self.assertEqual(await self.metric("restores_total"), 1)
        response = await http.get(self.daemon.url + "/engines/requests?limit=1", headers=self.keys)
        (record,) = await response.json()
        self.assertEqual(record["cached_tokens"], usage.prompt_tokens_details.cached_tokens, "its record")
        self.assertEqual(record["cache"], "restored", "and where they came from")
        overview = await (await http.get(self.daemon.url + "/engines/overview", headers=self.keys)).json()
        self.assertEqual(sum(c["restores"] for c in overview["cache"].values()), 1, "the page's counts")

    async def test_next_turn_after_a_daemon_restart(self) -> None:
        await self.start("[cache]\nmin_tokens = 64\n")
        await self.daemon.import_model(MODEL, smollm2())
        messages = opening("marbles")
        first = await self.ask(messages)
        await self.daemon.stop()  # SIGTERM of the daemon: its runners' slots are saved first
        self.daemon = InProcessDaemon(self.daemon.config_path)
        self.addCleanup(lambda: ensureDeferred(self.daemon.stop()))
        self.client = self.client.with_options(base_url=self.daemon.url + "/engines/v1")
        await self.next_turn_is_cached(first, messages)

    async def make_run(self, terminal: bool = True) -> MakeRun:
        """``make run`` on this test's home (its tap.conf saves states of 64 tokens and more)."""
        if not hasattr(self, "home"):
            cached_llama_server()
            self.home, self.port = short_home(self), free_port()
            (self.home / "tap.conf").write_text("[cache]\nmin_tokens = 64\n")
        run = await make_run(self, self.home, self.port, terminal)
        self.daemon = run  # type: ignore[assignment]  # what the checks read of a daemon: its url
        self.client = OpenAI(base_url=self.daemon.url + "/engines/v1", api_key="unused", max_retries=0)
        return run

    def saved_by_the_daemons_stop(self, run: MakeRun, signal: str) -> None:
        """The daemon heard C{signal} and stopped its runner after it saved its slots, not the other way."""
        self.assertIn(f"Received {signal}, shutting down.", run.text())
        self.assertNotIn("were not all saved", run.text())
        self.assertNotIn("cannot be reached", run.text())
        self.assertEqual(len(list((self.home / "cache").glob("*.bin"))), 1, run.tail())

    async def test_next_turn_after_ctrl_c_of_make_run(self) -> None:
        """``make run`` in a terminal, a turn, Ctrl-C: the SIGINT reaches the daemon, not its runner (in
        a session of its own), so the daemon's stop saves the runner's slots first; after ``make run``
        again, the next turn restores them (issue 53 N2)."""
        run = await self.make_run()
        messages = opening("marbles")
        first = await self.ask(messages)
        await run.ctrl_c()
        self.saved_by_the_daemons_stop(run, "SIGINT")
        run = await self.make_run()
        await self.next_turn_is_cached(first, messages)
        await run.ctrl_c()

    async def test_sigint_to_a_backgrounded_make_run(self) -> None:
        """A script's ``make run &`` starts with SIGINT ignored; ``kill -INT`` of its process group stops
        the daemon all the same, which saves its runner's slots first (issue 53 N3)."""
        run = await self.make_run(terminal=False)
        await self.ask(opening("marbles"))
        await run.interrupt_group()
        self.saved_by_the_daemons_stop(run, "SIGINT")

    async def test_next_turn_after_the_keep_alive_ran_out(self) -> None:
        await self.start('[cache]\nmin_tokens = 64\n[models."ai/smollm2"]\nkeep_alive = "1s"\n')
        await self.daemon.import_model(MODEL, smollm2())
        messages = opening("marbles")
        first = await self.ask(messages)
        await eventually(lambda: not self.daemon.scheduler.snapshot(), seconds=30)
        await self.next_turn_is_cached(first, messages)

    async def test_next_turn_after_an_eviction_for_another_model(self) -> None:
        await self.start("max_runners = 1\n[cache]\nmin_tokens = 64\n")  # max_runners: in [scheduler]
        await self.daemon.import_model(MODEL, smollm2())
        await self.tiny()
        messages = opening("marbles")
        first = await self.ask(messages)
        await self.call(
            self.client.chat.completions.create,
            model=TINY,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=2,
        )
        await self.next_turn_is_cached(first, messages)

    async def test_a_state_is_restored_only_for_the_key_that_made_it(self) -> None:
        await self.start('[cache]\nmin_tokens = 64\n[http]\napi_keys = ["alice-key", "bob-key"]\n')
        self.keys = {"Authorization": "Bearer alice-key"}
        await self.daemon.import_model(MODEL, smollm2())
        alice = self.client.with_options(api_key="alice-key")
        self.client = self.client.with_options(api_key="bob-key")
        messages = opening("marbles")
        first = await self.call(
            alice.chat.completions.create, model=MODEL, messages=messages, temperature=0, max_tokens=12
        )
        await self.unload()
        messages += [
            {"role": "assistant", "content": first.choices[0].message.content},
            {"role": "user", "content": "And the last box?"},
        ]
        bobs = await self.ask(messages)  # bob sends alice's conversation: nothing of hers is restored
        self.assertEqual(bobs.usage.prompt_tokens_details.cached_tokens, 0, bobs.usage)
        self.assertEqual(await self.metric("restores_total"), 0)
        self.client = alice
        await self.next_turn_is_cached(first, messages[:-2])

    async def test_an_anthropic_conversation_after_an_unload(self) -> None:
        """Claude Code's API: the request converted as llama-server converts it, blocks and all."""
        await self.start("[cache]\nmin_tokens = 64\n", parallel=2)
        await self.daemon.import_model(MODEL, smollm2())
        client = anthropic.Anthropic(
            base_url=self.daemon.url + "/anthropic",
            api_key="unused",
            max_retries=0,
            default_headers={"Connection": "close"},
        )
        system = [{"type": "text", "text": "You answer in one short sentence."}]
        [_, user] = opening("marbles")
        messages: list[dict[str, Any]] = [
            {"role": "user", "content": [{"type": "text", "text": user["content"]}]}
        ]

        def ask() -> Any:
            return client.messages.create(
                model=MODEL, max_tokens=12, system=system, messages=messages, extra_body={"temperature": 0}
            )

        first = await self.call(ask)
        await self.unload()
        messages += [
            {"role": "assistant", "content": [{"type": "text", "text": first.content[0].text}]},
            {"role": "user", "content": "And the last box?"},
        ]
        usage = (await self.call(ask)).usage
        read = usage.cache_read_input_tokens
        self.assertGreaterEqual(read, 0.9 * (read + usage.input_tokens), usage)
        self.assertEqual(await self.metric("restores_total"), 1)

    async def test_next_turn_after_an_unload(self) -> None:
        await self.start("[cache]\nmin_tokens = 64\n", parallel=2)
        await self.daemon.import_model(MODEL, smollm2())
        messages = opening("marbles")
        first = await self.ask(messages)
        await self.unload()
        saved = list((self.home / "cache").glob("*.bin"))
        self.assertEqual(len(saved), 1, saved)

        messages += [
            {"role": "assistant", "content": first.choices[0].message.content},
            {"role": "user", "content": "And the last box?"},
        ]
        restored = await self.ask(messages)
        usage = restored.usage
        cached = usage.prompt_tokens_details.cached_tokens
        self.assertGreaterEqual(cached, 0.9 * usage.prompt_tokens, usage)
        self.assertEqual(await self.metric("restores_total"), 1)

        # The same turn read afresh (cache_prompt off) gives the same greedy answer.
        fresh = await self.ask(messages, cache_prompt=False)
        self.assertEqual(fresh.usage.prompt_tokens_details.cached_tokens, 0)
        self.assertEqual(restored.choices[0].message.content, fresh.choices[0].message.content)

        other = await self.ask(opening("apples"))
        self.assertEqual(other.usage.prompt_tokens_details.cached_tokens, 0, other.usage)
        self.assertEqual(await self.metric("restores_total"), 1)
        listed = json.loads((self.home / "cache" / (saved[0].stem + ".json")).read_text())
        self.assertEqual(listed["owner"], None)

        # /engines/df counts the states; removing the model removes them.
        await self.unload()
        df = json.loads(await (await http.get(self.daemon.url + "/engines/df")).text())
        self.assertGreaterEqual(df["prompt_cache_files"], 1)
        self.assertGreater(df["prompt_cache_disk_usage"], 1_000_000)
        listed = await self.mrunner("cache")
        self.assertRegex(listed, r"ai/smollm2:latest +\d{4} +\d+(\.\d+)? MiB")
        self.assertIn("removed 0 saved states", await self.mrunner("cache", "rm", "ai/other"))
        response = await http.delete(self.daemon.url + f"/models/{MODEL}")
        self.assertEqual(response.code, 200, await response.text())
        self.assertEqual(list((self.home / "cache").iterdir()), [])
