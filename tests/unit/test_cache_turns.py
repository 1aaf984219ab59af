"""The prompt cache's turns and saves against a fake runner: which slot a turn takes, what is restored,
what is saved before a stop, and that nothing failing on the way fails the request."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
from twisted.internet.defer import CancelledError, Deferred, ensureDeferred, fail, succeed
from twisted.internet.task import Clock
from twisted.trial.unittest import TestCase

from mrunner.cache.calls import Refused
from mrunner.cache.slots import conversation
from mrunner.cache.statefile import token_bytes
from mrunner.cache.store import CacheStore
from mrunner.cache.turns import PromptCache
from mrunner.config import Config, ModelConfig, ModelsConfig
from mrunner.errors import Unavailable
from mrunner.values.backend import Command
from tests.support.fakes import FakeProcess
from tests.support.statefiles import write_state

SOCKET = "/run/r1.sock"
CHAT = b"/v1/chat/completions"


class FakeCalls:
    """A runner's slot calls: each slot holds C{held[n]}; a prompt tokenizes as C{prompt}."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.held: dict[int, list[int]] = {}
        self.prompt: list[int] = []
        self.saves: list[int] = []
        self.restores: list[tuple[int, str]] = []
        self.tokenized = 0
        self.refuse_restore = False
        self.hang = False
        self.erased: list[int] = []
        self.refuse_erase = False

    def slots(self, socket: str) -> Deferred[Any]:
        return succeed([{"id": n, "n_prompt_tokens": len(tokens)} for n, tokens in self.held.items()])

    def save(self, socket: str, slot: int, filename: str) -> Deferred[Any]:
        self.saves.append(slot)
        write_state(self.folder / filename, self.held[slot])
        return Deferred() if self.hang else succeed({})

    def restore(self, socket: str, slot: int, filename: str) -> Deferred[Any]:
        if self.refuse_restore:
            return fail(Refused("POST /slots: 400 invalid slot save file"))
        self.restores.append((slot, filename))
        return succeed({})

    def erase(self, socket: str, slot: int) -> Deferred[Any]:
        if self.refuse_erase:
            return fail(Refused("POST /slots: 500"))
        self.erased.append(slot)
        return succeed({})

    async def tokens(self, socket: str, path: bytes, payload: dict[str, Any]) -> bytes:
        self.tokenized += 1
        return token_bytes(self.prompt)


def chat(*contents: str) -> bytes:
    return json.dumps({"messages": [{"role": "user", "content": c} for c in contents]}).encode()


class TurnTestCase(TestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.folder = Path(self.mktemp())
        self.model = Path(self.mktemp())
        self.model.write_text("weights")
        self.store = CacheStore(self.folder, 10**9, 3600.0, self.clock.seconds, min_tokens=10)
        self.store.open()
        self.calls = FakeCalls(self.folder)
        self.told: list[str] = []  # where each turn's cached prompt came from, as a record is told
        told = lambda request, source: self.told.append(source)  # noqa: E731
        self.cache = PromptCache(self.store, self.calls, self.clock, 5.0, lambda request: request, told)  # type: ignore[arg-type]
        command = Command(
            "/opt/llama-server",
            ("--model", str(self.model), "--parallel", "2", "--slot-save-path", str(self.folder)),
        )
        self.process = FakeProcess(SOCKET)
        self.cache.start_runner(lambda *args: self.process)(command, SOCKET, Path("log"), "label")

    async def turn(self, body: bytes, owner: str | None = None, path: bytes = CHAT) -> dict[str, Any]:
        """The body the runner is sent for this turn (the turn ends at once)."""
        async with self.cache.turn(owner, SOCKET, path, body) as sent:  # type: ignore[arg-type]
            result: dict[str, Any] = json.loads(sent)
        return result

    def saved_state(self, tokens: list[int], owner: str | None = None) -> None:
        part = self.store.part_name()
        write_state(self.folder / part, tokens)
        self.store.add(part, self.cache._live[SOCKET].layout, owner, str(self.model))


class AffinityTests(TurnTestCase):
    async def test_a_conversations_next_turn_takes_its_slot(self) -> None:
        first = (await self.turn(chat("a")))["id_slot"]
        other = (await self.turn(chat("b")))["id_slot"]
        self.assertNotEqual(first, other)
        self.assertEqual((await self.turn(chat("a", "reply", "more")))["id_slot"], first)
        self.assertEqual((await self.turn(chat("b", "reply", "more")))["id_slot"], other)
        self.assertEqual(self.calls.tokenized, 0)  # nothing saved: no prompt is tokenized
        self.assertEqual(self.told, ["none", "none", "slot", "slot"])

    async def test_the_instance_whose_slot_holds_the_turn_is_preferred(self) -> None:
        await self.turn(chat("a"))
        other = attrs.make_class("Runner", ["socket", "has_room"])
        here, elsewhere = other(SOCKET, True), other("/run/r2.sock", True)
        request = attrs.make_class("Request", ["conversation"])

        def turn(*contents: str) -> Any:
            return request(conversation(CHAT, json.loads(chat(*contents))) if contents else ())

        self.assertIs(self.cache.prefer(turn("a", "b", "c"), [elsewhere, here]), here)
        self.assertIsNone(self.cache.prefer(turn("z"), [elsewhere, here]))
        self.assertIsNone(self.cache.prefer(turn(), [elsewhere, here]))
        self.assertIsNone(self.cache.prefer(turn("a", "b"), [other(SOCKET, False)]))

    async def test_a_conversation_the_gateway_read_is_not_read_again(self) -> None:
        """Given the turn's conversation, the body is not decoded (here it could not be) to place it."""
        parts = conversation(CHAT, json.loads(chat("a")))
        async with self.cache.turn(None, SOCKET, CHAT, b"{not json}", parts) as sent:  # type: ignore[arg-type]
            self.assertTrue(sent.startswith(b'{"id_slot":'), sent)
        self.assertEqual((await self.turn(chat("a", "reply", "more")))["id_slot"], int(sent[11:12]))

    async def test_a_body_naming_its_slot_is_left_alone(self) -> None:
        body = json.dumps({"id_slot": 1, "messages": []}).encode()
        async with self.cache.turn(None, SOCKET, CHAT, body) as sent:  # type: ignore[arg-type]
            self.assertEqual(sent, body)


class KeysApartTests(TurnTestCase):
    """Without share_cache, no turn of one key's is served from a slot holding another key's tokens
    (issue 53 H2: B's guess at A's prompt was given A's slot, and its cached tokens told)."""

    async def test_a_slot_of_another_keys_is_erased_before_it_serves(self) -> None:
        alices = (await self.turn(chat("secret"), owner="alice"))["id_slot"]
        slots = self.cache._live[SOCKET].slots
        slots[1 - alices].busy = True  # bob's own slot is in use: only alice's is free
        sent = await self.turn(chat("secret", "guess"), owner="bob")
        self.assertEqual((sent["id_slot"], self.calls.erased), (alices, [alices]))
        self.assertEqual(self.told, ["none", "none"])
        # Now it is bob's: his next turn takes it without erasing; alice's is erased again.
        await self.turn(chat("secret", "guess", "more"), owner="bob")
        self.assertEqual(self.calls.erased, [alices])
        await self.turn(chat("secret", "again"), owner="alice")
        self.assertEqual(self.calls.erased, [alices, alices])

    async def test_a_key_spends_its_own_slot_before_another_keys(self) -> None:
        alices = (await self.turn(chat("secret"), owner="alice"))["id_slot"]
        bobs = (await self.turn(chat("mine"), owner="bob"))["id_slot"]
        self.clock.advance(1)
        await self.turn(chat("mine", "again"), owner="bob")  # alice's is now the least recent
        self.assertEqual((await self.turn(chat("secret", "guess"), owner="bob"))["id_slot"], bobs)
        self.assertNotEqual(alices, bobs)
        self.assertEqual(self.calls.erased, [])

    async def test_a_slot_that_cannot_be_erased_refuses_the_turn(self) -> None:
        alices = (await self.turn(chat("secret"), owner="alice"))["id_slot"]
        self.cache._live[SOCKET].slots[1 - alices].busy = True
        self.calls.refuse_erase = True
        with self.assertRaises(Unavailable):
            await self.turn(chat("secret", "guess"), owner="bob")
        slot = self.cache._live[SOCKET].slots[alices]
        self.assertEqual((slot.busy, slot.owner), (False, "alice"))

    async def test_a_turn_llama_server_places_erases_other_keys_free_slots(self) -> None:
        """Anthropic's (llama-server drops id_slot there) and a list of prompts: placed by similarity."""
        await self.turn(chat("secret"), owner="alice")
        await self.turn(chat("other"), owner="alice")
        await self.turn(chat("secret", "guess"), owner="bob", path=b"/v1/messages")
        self.assertEqual(sorted(self.calls.erased), [0, 1])
        self.assertEqual([s.owner for s in self.cache._live[SOCKET].slots.all], ["bob", "bob"])
        body = json.dumps({"prompt": ["secret"]}).encode()
        async with self.cache.turn("alice", SOCKET, b"/v1/completions", body) as sent:  # type: ignore[arg-type]
            self.assertEqual(sent, body)
        self.assertEqual(sorted(self.calls.erased), [0, 0, 1, 1])

    async def test_a_keys_body_cannot_name_its_slot(self) -> None:
        alices = (await self.turn(chat("secret"), owner="alice"))["id_slot"]
        self.cache._live[SOCKET].slots[1 - alices].busy = True
        body = json.dumps({"id_slot": alices, "messages": [{"role": "user", "content": "secret"}]})
        sent = await self.turn(body.encode(), owner="bob")
        self.assertEqual((sent["id_slot"], self.calls.erased), (alices, [alices]))
        self.assertEqual(list(sent).count("id_slot"), 1)


class RestoreTests(TurnTestCase):
    async def test_the_saved_prefix_is_restored_into_a_free_slot(self) -> None:
        self.saved_state(list(range(50)))
        self.calls.prompt = [*range(50), 7, 8]
        sent = await self.turn(chat("a", "reply", "more"))
        [(slot, filename)] = self.calls.restores
        self.assertEqual(sent["id_slot"], slot)
        self.assertEqual(filename.removesuffix(".bin"), next(iter(self.store.states)))
        self.assertEqual((self.cache.counts.restores, self.cache.counts.restored_tokens), (1, 50))
        self.assertEqual(self.told, ["restored"])
        # The next turn finds its slot: no tokenizing, no restore.
        await self.turn(chat("a", "reply", "more", "reply", "again"))
        self.assertEqual((self.calls.tokenized, len(self.calls.restores)), (1, 1))

    async def test_a_state_that_is_not_a_prefix_is_not_restored(self) -> None:
        self.saved_state(list(range(50)))
        self.calls.prompt = [*range(49), 1000, 1001]
        sent = await self.turn(chat("a"))
        self.assertEqual(self.calls.restores, [])
        self.assertIn("id_slot", sent)
        self.assertEqual(self.cache.counts.misses, 1)

    async def test_a_state_whose_file_was_replaced_is_not_restored(self) -> None:
        self.saved_state(list(range(50)))
        [saved] = self.store.states.values()
        write_state(self.folder / self.store.state_name(saved), list(range(50)), state=b"\x02" * 64)
        self.calls.prompt = [*range(50), 7]
        await self.turn(chat("a"))
        self.assertEqual((self.calls.restores, self.store.states, self.told), ([], {}, ["none"]))

    async def test_another_keys_state_is_not_restored(self) -> None:
        self.saved_state(list(range(50)), owner="alice")
        self.calls.prompt = [*range(50), 7]
        await self.turn(chat("a"), owner="bob")
        self.assertEqual((self.calls.tokenized, self.calls.restores), (0, []))
        await self.turn(chat("a"), owner="alice")
        self.assertEqual(len(self.calls.restores), 1)

    async def test_a_shared_models_states_serve_every_key(self) -> None:
        """[models."NAME"] share_cache: saved and found with no owner, whoever asks."""
        self.cache.configure(
            Config(models=ModelsConfig(settings={"ai/m:latest": ModelConfig(share_cache=True)}))
        )
        command = Command(
            "/opt/llama-server",
            ("--model", str(self.model), "--alias", "ai/m:latest", "--slot-save-path", "x"),
        )
        self.cache.start_runner(lambda *args: FakeProcess("/run/r2.sock"))(
            command, "/run/r2.sock", Path("l"), "l"
        )
        live = self.cache._live["/run/r2.sock"]
        part = self.store.part_name()
        write_state(self.folder / part, list(range(50)))
        self.store.add(part, live.layout, None, str(self.model))
        self.calls.prompt = [*range(50), 7]
        async with self.cache.turn("bob", "/run/r2.sock", CHAT, chat("a")):  # type: ignore[arg-type]
            pass
        self.assertEqual(len(self.calls.restores), 1)

    async def test_a_refused_restore_removes_the_state_and_the_turn_goes_on(self) -> None:
        self.saved_state(list(range(50)))
        self.calls.prompt = [*range(50), 7]
        self.calls.refuse_restore = True
        sent = await self.turn(chat("a"))
        self.assertEqual(sent["messages"], [{"role": "user", "content": "a"}])
        self.assertEqual(self.cache.counts.failed_restores, 1)
        self.assertEqual(self.told, ["none"])
        self.assertEqual(self.store.states, {})
        self.assertEqual(list(self.folder.iterdir()), [])

    def test_a_client_gone_while_restoring_frees_its_slot(self) -> None:
        self.saved_state(list(range(50)))
        waiting: Deferred[None] = Deferred()

        async def tokens(*args: object) -> bytes:
            await waiting
            return b""

        self.calls.tokens = tokens  # type: ignore[method-assign]
        turn = ensureDeferred(self.turn(chat("a")))
        turn.cancel()
        self.failureResultOf(turn, CancelledError)
        self.assertEqual([s.busy for s in self.cache._live[SOCKET].slots.all], [False, False])


class SaveTests(TurnTestCase):
    async def test_slots_long_enough_are_saved_with_their_owner(self) -> None:
        await self.turn(chat("a"), owner="alice")
        self.calls.held = {0: list(range(40)), 1: [1, 2, 3]}
        await self.process.before_stop()
        self.assertEqual(self.calls.saves, [0])
        [saved] = self.store.states.values()
        self.assertEqual((saved.owner, saved.tokens), ("alice", token_bytes(list(range(40)))))
        self.assertEqual(self.cache.counts.saves, 1)

    async def test_a_disk_without_room_saves_nothing(self) -> None:
        self.store._free = lambda path: 0
        self.calls.held = {0: list(range(40))}
        await self.process.before_stop()
        self.assertEqual((self.calls.saves, list(self.folder.iterdir())), ([], []))

    def test_a_save_that_hangs_is_given_up_in_time(self) -> None:
        self.calls.held = {0: list(range(40))}
        self.calls.hang = True
        done = ensureDeferred(_wait(self.process.before_stop()))
        self.assertNoResult(done)
        self.clock.advance(5.0)
        self.successResultOf(done)
        self.assertEqual((self.store.states, list(self.folder.iterdir())), ({}, []))


async def _wait(d: Deferred[Any]) -> None:
    await d
