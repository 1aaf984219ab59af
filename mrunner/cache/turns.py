"""The prompt cache at work: states saved before a planned stop, restored for the turn they begin.

L{PromptCache.start_runner} wraps the scheduler's runner start: a llama-server
started with C{--slot-save-path} is known by its socket, its layout and its
slots, and its process saves its slots before it is sent SIGTERM
(L{PromptCache.save}, within a time limit; a crash saves nothing). Every chat or
completion request to such a runner takes a slot through L{PromptCache.turn}:
the free slot that holds its conversation, else (when states of its layout and
key are saved) the one a saved state is restored into, that state's tokens being
the longest exact prefix of the request's as the runner tokenizes them; else the
nearest. The request is sent with C{id_slot}. Whatever fails on the way (the
runner refuses a restore, a file is gone or cut short, a call times out), the
request goes on without the state, and a state that failed is removed.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Protocol, TypeVar

import attrs
from twisted.internet.defer import CancelledError, Deferred, ensureDeferred, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.web.iweb import IRequest

from mrunner.cache.anthropic import MESSAGES
from mrunner.cache.calls import Refused, RunnerCalls
from mrunner.cache.layout import flag_value, layout
from mrunner.cache.slots import Conversation, Slot, Slots, conversation
from mrunner.cache.store import CacheStore, SaveRefused
from mrunner.config import Config
from mrunner.errors import Unavailable
from mrunner.interfaces import IRunnerProcess
from mrunner.values.backend import Command

StartRunner = Callable[[Command, str, Path, str], IRunnerProcess]
#: The key a request came with, as its SHA-256 (None without keys): whose saved states it may use.
OwnerOf = Callable[[IRequest], str | None]
#: Told, for a turn, where its cached prompt came from: "slot" (held there since its earlier turn),
#: "restored" (from a saved state) or "none" (the request's record keeps it).
Told = Callable[[IRequest, str], None]
SLOT, RESTORED, NONE = "slot", "restored", "none"


def untold(request: IRequest, source: str) -> None:
    """No one keeps where a turn's cached prompt came from."""


SAVE_PATH = "--slot-save-path"


class _HasConversation(Protocol):
    @property
    def conversation(self) -> tuple[object, ...]: ...


class _Instance(Protocol):
    @property
    def socket(self) -> str: ...

    @property
    def has_room(self) -> bool: ...


Instance = TypeVar("Instance", bound=_Instance)


@attrs.define
class Counts:
    """What C{/metrics} shows of the cache (L{mrunner.cache.metrics})."""

    hits: int = 0
    misses: int = 0
    restores: int = 0
    failed_restores: int = 0
    saves: int = 0
    saved_bytes: int = 0
    restored_tokens: int = 0

    def add(self, amounts: dict[str, int]) -> None:
        for name, amount in amounts.items():
            setattr(self, name, getattr(self, name) + amount)


@attrs.define(eq=False)
class Live:
    """A runner that saves its slots: its state files' layout, its model file, its slots."""

    layout: str
    model: str
    slots: Slots
    #: The model's name as the runner serves it.
    alias: str = ""
    #: Whether its states serve every key ([models."NAME"] share_cache): their owner is then none.
    shared: bool = False


class PromptCache:
    """The runners that save their slots, by socket; their slots; the store of saved states; the counts."""

    log = Logger()

    def __init__(
        self,
        store: CacheStore,
        calls: RunnerCalls,
        clock: IReactorTime,
        save_timeout: float,
        owner_of: OwnerOf,
        told: Told = untold,
    ):
        self.store = store
        self._calls = calls
        self._clock = clock
        self.save_timeout = save_timeout
        self._owner_of = owner_of
        self._told = told
        #: The models whose states every key may use, by name ([models."NAME"] share_cache).
        self.shared: frozenset[str] = frozenset()
        self.counts = Counts()
        #: The same counts, model by model (by the name its runners serve it as), for the page.
        self.by_model: dict[str, Counts] = {}
        self._live: dict[str, Live] = {}

    def start_runner(self, start: StartRunner) -> StartRunner:
        """C{start}, for runners whose command saves slots known by their socket and saved before a stop."""

        def started(command: Command, socket: str, log_path: Path, label: str) -> IRunnerProcess:
            process = start(command, socket, log_path, label)
            if flag_value(command, SAVE_PATH) is not None:
                slots = Slots(int(flag_value(command, "--parallel") or 1))
                model, alias = flag_value(command, "--model") or "", flag_value(command, "--alias") or ""
                self._live[socket] = Live(layout(command), model, slots, alias, alias in self.shared)
                process.before_stop = lambda: self.save(socket)
                process.ended.addBoth(self._gone, socket)
            return process

        return started

    def configure(self, config: Config) -> None:
        """The models whose states every key may use, from tap.conf as it is now (at start, on reload)."""
        self.shared = frozenset(name for name, model in config.models.settings.items() if model.share_cache)

    def _gone(self, result: object, socket: str) -> object:
        self._live.pop(socket, None)
        return result

    def _count(self, live: Live, **amounts: int) -> None:
        """Add C{amounts} to the whole cache's counts and to its model's."""
        self.counts.add(amounts)
        self.by_model.setdefault(live.alias, Counts()).add(amounts)

    def prefer(self, request: _HasConversation, running: Sequence[Instance]) -> Instance | None:
        """Of C{running}, an instance with room whose free slot holds C{request}'s earlier turn."""
        if not request.conversation:
            return None
        for runner in running:
            live = self._live.get(runner.socket)
            if runner.has_room and live is not None and live.slots.holds(request.conversation):
                return runner
        return None

    # Saving

    def save(self, socket: str) -> Deferred[None]:
        """Save the slots of the runner at C{socket} that hold enough tokens; never fails, and fires within
        the time limit (a save still running then is abandoned, its partial file removed)."""
        live = self._live.get(socket)
        if live is None:
            return succeed(None)
        d = ensureDeferred(self._save(live, socket)).addTimeout(self.save_timeout, self._clock)
        return d.addErrback(self._not_saved, socket)

    def _not_saved(self, reason: Any, socket: str) -> None:
        self.log.warn("runner {socket}: its slots were not all saved: {why}", socket=socket, why=reason.value)

    async def _save(self, live: Live, socket: str) -> None:
        started = self._clock.seconds()
        for info in await self._calls.slots(socket):
            if info.get("n_prompt_tokens", 0) < max(1, self.store.min_tokens):
                continue
            if not self.store.room():
                self.log.warn("prompt cache: the disk keeps too little free; slots not saved")
                return
            part = self.store.part_name()
            try:
                await self._calls.save(socket, info["id"], part)
                owner = live.slots[info["id"]].owner
                saved = self.store.add(part, live.layout, owner, live.model, live.alias)
            except (SaveRefused, Refused) as e:
                self.log.info("slot {slot} not saved: {why}", slot=info["id"], why=e)
                continue
            finally:
                if part.removesuffix(".part") not in self.store.states:
                    self.store.discard(part)
            self._count(live, saves=1, saved_bytes=saved.size)
        self.log.info(
            "runner {socket}: slots saved in {s:.3f}s", socket=socket, s=self._clock.seconds() - started
        )

    # Turns

    @asynccontextmanager
    async def turn(
        self, request: IRequest, socket: str, path: bytes, body: bytes, known: Conversation = ()
    ) -> AsyncIterator[bytes]:
        """The body to send for this turn (with the C{id_slot} it takes), for the block's duration.

        The slot is the free one that holds the turn's conversation; else, when states of the
        runner's layout and the turn's key are saved, a spare one to restore the best of them into;
        else the nearest. It is busy until the block ends, however it ends (a client gone too).
        C{known}: the conversation the gateway already read from the body (an OpenAI chat's), so
        the body is decoded again only to tokenize it; else it is read here (a translated one's).
        Where keys do not share the cache, a slot that may hold another key's tokens is erased
        before it serves the turn (L{Slot.foreign}); so are all free ones before a turn llama-server
        places itself (Anthropic's, a list of prompts); and a key's body cannot name its slot.
        """
        live = self._live.get(socket)
        payload = None if known or live is None else _payload(body)
        owner = None if live is None or live.shared else self._owner_of(request)
        if owner is not None and payload is not None and "id_slot" in payload:
            del payload["id_slot"]  # mrunner places a key's turns: none names another key's slot
            body = json.dumps(payload).encode()
        parts = known or (None if payload is None else conversation(path, payload))
        if live is not None and owner is not None and (parts is None or path.endswith(MESSAGES)):
            await self._unplaced(live, socket, owner)
        if live is None or parts is None:
            yield body
            return
        slot = live.slots.holding(parts, owner)
        restoring = slot is None and self.store.candidates(live.layout, owner)
        if slot is None:
            slot = live.slots.spare(owner) if restoring else live.slots.nearest(parts, owner)
        if slot is None:
            yield body
            return
        await self._claim(socket, slot, owner)
        try:
            if restoring:
                slot.held = ()
                payload = payload or json.loads(body)
                restored = await self._restore_into(slot, live, socket, path, payload, owner)
                self._told(request, RESTORED if restored else NONE)
            elif slot.held and slot.shared(parts) == len(slot.held):
                self._count(live, hits=1)
                self._told(request, SLOT)
            else:
                self._count(live, misses=1)
                self._told(request, NONE)
            if path.endswith(MESSAGES):  # llama-server drops id_slot there: its own choice by similarity
                yield body  # finds the slot restored or holding the conversation, which no other turn takes
            else:
                yield b'{"id_slot":%d,' % slot.id + body.lstrip()[1:]
        finally:
            slot.busy, slot.held, slot.owner, slot.used = False, parts, owner, self._clock.seconds()
            slot.blank = False

    async def _unplaced(self, live: Live, socket: str, owner: str) -> None:
        """Before a turn llama-server places itself, in any free slot: erase the free slots of other
        keys', and count every free slot as C{owner}'s from now, for the turn may land in any."""
        free = [s for s in live.slots.all if not s.busy]
        for slot in free:
            slot.busy = True
        try:
            for slot in free:
                if slot.foreign(owner):
                    await self._erase(socket, slot)
        finally:
            for slot in free:
                slot.busy = False
                if not slot.foreign(owner):
                    slot.blank, slot.owner = False, owner

    async def _claim(self, socket: str, slot: Slot, owner: str | None) -> None:
        """Take C{slot} for a turn of C{owner}'s, erased first if it may hold another key's tokens."""
        slot.busy = True
        try:
            if slot.foreign(owner):
                await self._erase(socket, slot)
        except BaseException:
            slot.busy = False  # still another key's: never counted as this one's
            raise

    async def _erase(self, socket: str, slot: Slot) -> None:
        """Empty C{slot} in the runner; a turn that cannot have it emptied is refused, never served
        from another key's tokens."""
        try:
            await self._calls.erase(socket, slot.id)
        except CancelledError:
            raise
        except Exception as e:
            self.log.warn("prompt cache: slot {slot} could not be erased: {why}", slot=slot.id, why=e)
            raise Unavailable("the runner could not clear a slot for this request; try again") from e
        slot.erased()

    async def _restore_into(
        self, slot: Slot, live: Live, socket: str, path: bytes, payload: dict[str, Any], owner: str | None
    ) -> bool:
        """Restore into C{slot} the saved state whose tokens begin the request's longest; whether one was."""
        try:
            tokens = await self._calls.tokens(socket, path, payload)
        except CancelledError:
            raise  # the client went away: so does its turn
        except Exception as e:
            self.log.info("prompt cache: could not tokenize a prompt: {why}", why=e)
            self._count(live, misses=1)
            return False
        saved = self.store.best(live.layout, owner, tokens)
        if saved is None or not self.store.intact(saved):
            self._count(live, misses=1)
            return False
        try:
            await self._calls.restore(socket, slot.id, self.store.state_name(saved))
        except CancelledError:
            raise
        except Exception as e:
            self.log.warn("prompt cache: restoring {name} failed, removed: {why}", name=saved.name, why=e)
            self.store.remove(saved)
            self._count(live, failed_restores=1, misses=1)
            return False
        self.store.used(saved)
        self._count(live, restores=1, hits=1, restored_tokens=saved.n_tokens)
        return True


def _payload(body: bytes) -> dict[str, Any] | None:
    """The request's JSON object, if it is one."""
    try:
        payload = json.loads(body)
    except ValueError:
        return None
    return payload if isinstance(payload, dict) else None
