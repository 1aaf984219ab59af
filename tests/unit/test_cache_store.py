"""The prompt cache's store of saved states: whole files only, exact prefixes only, each key its own."""

from __future__ import annotations

import errno
import json
import os
import struct
from pathlib import Path

from twisted.trial.unittest import TestCase

from mrunner.cache import store as store_module
from mrunner.cache.statefile import MAGIC, VERSION, CorruptState, read_tokens, token_bytes
from mrunner.cache.store import CacheStore, SaveRefused
from tests.support.statefiles import state_bytes, write_state

LAYOUT = "layout-a"


class StoreTestCase(TestCase):
    def setUp(self) -> None:
        self.now = 1000.0
        self.folder = Path(self.mktemp())
        self.model = Path(self.mktemp())
        self.model.write_text("weights")
        self.store = self.new_store()

    def new_store(self, **kwargs: object) -> CacheStore:
        store = CacheStore(self.folder, 10**9, 3600.0, lambda: self.now, **kwargs)  # type: ignore[arg-type]
        store.open()
        return store

    def save(self, tokens: list[int], owner: str | None = None, store: CacheStore | None = None) -> str:
        store = store or self.store
        part = store.part_name()
        write_state(self.folder / part, tokens)
        return store.add(part, LAYOUT, owner, str(self.model)).name


class StateFileTests(TestCase):
    def test_packed_and_plain_tokens(self) -> None:
        path = Path(self.mktemp())
        self.assertEqual(read_tokens(write_state(path, [5, 6, 7])), token_bytes([5, 6, 7]))
        self.assertEqual(read_tokens(write_state(path, [5, 6, 7], packed=False)), token_bytes([5, 6, 7]))

    def test_a_truncated_file_is_corrupt(self) -> None:
        path = Path(self.mktemp())
        path.write_bytes(state_bytes(list(range(100)))[:200])
        self.assertRaises(CorruptState, read_tokens, path)

    def test_a_wrong_magic_is_corrupt(self) -> None:
        path = Path(self.mktemp())
        path.write_bytes(b"XXXX" + state_bytes([1, 2])[4:])
        self.assertRaises(CorruptState, read_tokens, path)

    def test_a_sparse_files_head_claiming_more_than_any_state_is_not_read(self) -> None:
        """1 GiB of holes whose head claims 2^27 words: 512 MiB were read at start (issue 53 L4)."""
        path = Path(self.mktemp())
        path.write_bytes(struct.pack("<III", MAGIC, VERSION, 1 << 27))
        os.truncate(path, 1 << 30)
        self.assertRaises(CorruptState, read_tokens, path)

    def test_no_regular_file_is_read(self) -> None:
        fifo, link = Path(self.mktemp()), Path(self.mktemp())
        os.mkfifo(fifo)  # opened without blocking, then refused
        link.symlink_to(write_state(Path(self.mktemp()), [1, 2]))
        for path in (fifo, link):
            self.assertRaises(OSError, read_tokens, path)


class PrefixTests(StoreTestCase):
    def test_the_longest_exact_prefix(self) -> None:
        self.save(list(range(10)))
        longer = self.save([*range(20), 99])  # supersedes the first: its tokens begin this one
        self.assertEqual(len(self.store.states), 1)
        other = self.save([7] * 30)
        found = self.store.best(LAYOUT, None, token_bytes([*range(20), 99, 5, 5]))
        self.assertIsNotNone(found)
        assert found is not None
        self.assertEqual(found.name, longer)
        self.assertEqual(self.store.best(LAYOUT, None, token_bytes([7] * 31)).name, other)  # type: ignore[union-attr]

    def test_a_state_that_is_not_a_prefix_is_never_found(self) -> None:
        """It shares 19 of 20 tokens with the request, and then holds another conversation."""
        self.save([*range(19), 500])
        self.assertIsNone(self.store.best(LAYOUT, None, token_bytes([*range(19), 501, 502])))
        self.assertIsNone(self.store.best(LAYOUT, None, token_bytes(list(range(10)))))  # shorter request

    def test_another_keys_state_is_never_found(self) -> None:
        self.save(list(range(20)), owner="alice")
        request = token_bytes(list(range(30)))
        self.assertIsNone(self.store.best(LAYOUT, "bob", request))
        self.assertIsNone(self.store.best(LAYOUT, None, request))
        self.assertFalse(self.store.candidates(LAYOUT, "bob"))
        self.assertIsNotNone(self.store.best(LAYOUT, "alice", request))

    def test_another_layout_is_never_found(self) -> None:
        self.save(list(range(20)))
        self.assertIsNone(self.store.best("layout-b", None, token_bytes(list(range(30)))))


class WholeFileTests(StoreTestCase):
    def test_a_state_read_again_at_open(self) -> None:
        name = self.save(list(range(20)), owner="alice")
        again = self.new_store()
        self.assertEqual(list(again.states), [name])
        self.assertEqual(again.states[name].tokens, token_bytes(list(range(20))))
        self.assertEqual(again.states[name].owner, "alice")

    def test_a_truncated_state_is_removed_at_open(self) -> None:
        name = self.save(list(range(20)))
        state = self.folder / (name + ".bin")
        state.write_bytes(state.read_bytes()[:-10])
        self.assertEqual(self.new_store().states, {})
        self.assertEqual(list(self.folder.iterdir()), [])

    def test_a_folder_named_as_a_state_is_left_alone(self) -> None:
        """A directory C{x.bin} stopped the start ("Is a directory"); with an entry beside it too."""
        name = self.save(list(range(20)))
        (self.folder / "x.bin").mkdir()
        (self.folder / (name + ".bin")).unlink()
        (self.folder / (name + ".bin")).mkdir()
        self.assertEqual(self.new_store().states, {})
        self.assertEqual(sorted(p.name for p in self.folder.iterdir()), sorted([name + ".bin", "x.bin"]))

    def test_another_file_in_a_states_place_is_not_restored(self) -> None:
        """Another model's state of the same shape under an entry was restored (issue 53 L4)."""
        name = self.save(list(range(20)))
        other = self.folder / (name + ".bin")
        other.write_bytes(state_bytes(list(range(20)), state=b"\x02" * 64))
        store = self.new_store()
        self.assertFalse(store.intact(store.states[name]))
        self.assertEqual((store.states, list(self.folder.iterdir())), ({}, []))
        name = self.save(list(range(20)), store=store)
        self.assertTrue(store.intact(store.states[name]))
        self.assertTrue(self.new_store().intact(self.new_store().states[name]), "read again at open")

    def test_half_written_files_are_removed_at_open(self) -> None:
        write_state(self.folder / "abc.part", list(range(20)))
        write_state(self.folder / "def.bin", list(range(20)))  # no entry: its save never finished
        (self.folder / "ghi.json").write_text(json.dumps({"layout": LAYOUT}))  # no state
        self.assertEqual(self.new_store().states, {})
        self.assertEqual(list(self.folder.iterdir()), [])

    def test_a_truncated_save_is_refused(self) -> None:
        part = self.store.part_name()
        (self.folder / part).write_bytes(state_bytes(list(range(50)))[:100])
        self.assertRaises(SaveRefused, self.store.add, part, LAYOUT, None, str(self.model))
        self.assertEqual(list(self.folder.iterdir()), [])

    def test_a_short_slot_is_not_kept(self) -> None:
        store = self.new_store(min_tokens=30)
        self.assertRaises(SaveRefused, self.save, list(range(20)), None, store)
        self.assertEqual(list(self.folder.iterdir()), [])


class ListingTests(StoreTestCase):
    def test_listed_most_recent_first_and_cleared_by_model(self) -> None:
        part = self.store.part_name()
        write_state(self.folder / part, [1] * 20)
        self.store.add(part, LAYOUT, "ab" * 32, str(self.model), "ai/a:latest")
        self.now += 60
        part = self.store.part_name()
        write_state(self.folder / part, [2] * 30)
        self.store.add(part, LAYOUT, None, str(self.model), "ai/b:latest")
        listed = self.store.listing()
        self.assertEqual(
            [(s["model"], s["tokens"], s["key"]) for s in listed],
            [
                ("ai/b:latest", 30, None),
                ("ai/a:latest", 20, "ab" * 6),
            ],
        )
        self.assertEqual(listed[0]["last_used"], "1970-01-01T00:17:40+00:00")
        self.assertEqual(self.store.clear("ai/a:latest"), 1)
        self.assertEqual(self.store.clear(), 1)
        self.assertEqual((self.store.usage(), list(self.folder.iterdir())), ((0, 0), []))


class BoundsTests(StoreTestCase):
    def test_a_full_disk_refuses_the_save_and_leaves_nothing(self) -> None:
        def full(path: Path, data: bytes) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        self.patch(store_module, "_write_atomically", full)
        self.assertRaises(SaveRefused, self.save, list(range(20)))
        self.assertEqual(list(self.folder.iterdir()), [])
        self.assertEqual(self.store.states, {})

    def test_no_room_below_the_reserve(self) -> None:
        store = self.new_store(free=lambda path: 5 << 20, reserve=10 << 20)
        self.assertFalse(store.room())
        self.assertTrue(self.new_store(free=lambda path: 50 << 20, reserve=10 << 20).room())

    def test_the_least_recently_used_go_beyond_the_budget(self) -> None:
        first = self.save([1] * 20)
        self.now += 1
        second = self.save([2] * 20)
        self.now += 1
        self.store.used(self.store.states[first])
        size = self.store.states[first].size
        self.store.max_bytes = 2 * size
        self.now += 1
        third = self.save([3] * 20)
        self.assertEqual(set(self.store.states), {first, third})
        self.assertFalse((self.folder / (second + ".bin")).exists())

    def test_old_states_and_those_of_a_model_gone_are_swept(self) -> None:
        old = self.save([1] * 20)
        self.now += 3000
        kept = self.save([2] * 20)
        self.now += 1000
        self.store.sweep()
        self.assertEqual(list(self.store.states), [kept])
        self.assertFalse((self.folder / (old + ".bin")).exists())
        self.model.unlink()
        self.store.sweep()
        self.assertEqual(self.store.states, {})
