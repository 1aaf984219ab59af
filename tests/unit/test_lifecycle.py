"""The runner's machine: the table's moves, every other input refused, each output once, on a real record."""

from __future__ import annotations

import attrs
from twisted.internet.task import Clock
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from mrunner.errors import RunnerFailed
from mrunner.scheduling.lifecycle import MACHINE, Effects, IllegalMove, Input, Output, step
from mrunner.scheduling.moves import Moves
from mrunner.scheduling.roster import Roster, Runner
from mrunner.values import State
from tests.support.fakes import FakeProcess, RecordingEvents
from tests.support.loading import request
from tests.support.moves import pairs


class MovesTests(SynchronousTestCase):
    def test_check(self) -> None:
        moves = Moves("runner", {State.LOADING: frozenset({State.READY}), State.READY: frozenset()})
        self.assertIs(moves.check(State.LOADING, State.READY), State.READY)
        error = self.assertRaises(IllegalMove, moves.check, State.READY, State.LOADING)
        self.assertEqual(str(error), "a runner cannot go from ready to loading")
        self.assertEqual(pairs(moves), {(State.LOADING, State.READY)})


@attrs.define
class Recorder:
    """A core that records the outputs it is asked for, in order."""

    state: State
    calls: list[str] = attrs.field(factory=list)

    def __getattr__(self, name: str) -> object:
        if name in {output.value for output in Output}:
            return lambda: self.calls.append(name)
        raise AttributeError(name)


def recorder(state: State) -> Effects:
    return Recorder(state)  # type: ignore[return-value]


class TableTests(SynchronousTestCase):
    def test_each_move_runs_its_outputs_once_in_order(self) -> None:
        for (state, input), move in MACHINE.items():
            core = Recorder(state)
            step(core, input)  # type: ignore[arg-type]
            self.assertEqual(core.state, move.to, (state, input))
            self.assertEqual(core.calls, [output.value for output in move.outputs], (state, input))
            self.assertEqual(len(set(core.calls)), len(core.calls), "no output twice in one move")

    def test_every_other_input_is_refused_and_changes_nothing(self) -> None:
        refused = 0
        for state in State:
            for input in Input:
                if (state, input) in MACHINE:
                    continue
                core = Recorder(state)
                self.assertRaises(IllegalMove, step, core, input)
                self.assertEqual((core.state, core.calls), (state, []), (state, input))
                refused += 1
        self.assertEqual(refused, len(State) * len(Input) - len(MACHINE))
        self.assertGreater(refused, 0)

    def test_the_diagram(self) -> None:
        """The documented ways through, and a few that are not."""
        legal = [
            ((Input.ANSWER,), State.READY),
            ((Input.STOP, Input.END), State.ENDED),
            ((Input.FAIL, Input.FAIL, Input.END), State.ENDED),
            ((Input.ANSWER, Input.LEASE, Input.DRAIN, Input.RELEASE, Input.STOP), State.STOPPING),
            ((Input.ANSWER, Input.LEASE, Input.END, Input.RELEASE), State.ENDED),
        ]
        for inputs, state in legal:
            core = Recorder(State.LOADING)
            for input in inputs:
                step(core, input)  # type: ignore[arg-type]
            self.assertEqual(core.state, state, inputs)
        illegal = [
            (State.LOADING, Input.LEASE),
            (State.LOADING, Input.DRAIN),
            (State.READY, Input.ANSWER),
            (State.DRAINING, Input.LEASE),
            (State.DRAINING, Input.DRAIN),
            (State.STOPPING, Input.STOP),
            (State.STOPPING, Input.ANSWER),
            (State.ENDED, Input.END),
            (State.ENDED, Input.STOP),
        ]
        for state, input in illegal:
            self.assertRaises(IllegalMove, step, recorder(state), input)

    def test_every_output_is_a_method_of_the_record(self) -> None:
        for output in Output:
            self.assertTrue(callable(getattr(Runner, output.value, None)), output)


@attrs.define
class Keeper:
    """The loader's side, recorded; a failure is recorded with how often the process was stopped by then."""

    calls: list[str] = attrs.field(factory=list)

    def opened(self, runner: Runner) -> None:
        self.calls.append("opened")

    def failed(self, runner: Runner, reason: Failure) -> None:
        stops = runner.process.stops  # type: ignore[attr-defined]
        self.calls.append(f"failed: {reason.getErrorMessage()} after {stops} stops")

    def replan(self) -> None:
        self.calls.append("replan")


class RunnerTests(SynchronousTestCase):
    """The record's outputs do what they say, once: the process, the clock, the slots, the events."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.events = RecordingEvents()
        self.keeper = Keeper()
        self.roster = Roster(self.clock, self.events, self.keeper)
        self.process = FakeProcess("/run/r0.sock")
        self.process.exits_on_stop = False
        self.runner = self.roster.add(request(keep_alive=10), self.process)

    def ready(self) -> None:
        self.clock.advance(2)
        self.process.ready.callback(None)

    def test_ready(self) -> None:
        self.ready()
        self.assertIs(self.runner.state, State.READY)
        self.assertEqual(self.events.seen, [("loaded", 2.0)])
        self.assertEqual(self.keeper.calls, ["opened", "replan"])
        self.assertEqual(self.runner.finished_at, 2.0)

    def test_slots_and_the_keep_alive_clock(self) -> None:
        self.ready()
        self.runner.expiry.rest(now=self.fail, later=lambda: None)
        self.runner.lease()
        self.runner.lease()
        self.assertEqual(self.runner.in_use, 2)
        self.assertEqual(self.clock.getDelayedCalls(), [], "a lease stops the keep-alive clock")
        self.clock.advance(3)
        self.runner.release()
        self.assertEqual((self.runner.in_use, self.runner.finished_at), (1, 2.0))
        self.runner.release()
        self.assertEqual((self.runner.in_use, self.runner.finished_at), (0, 5.0), "the last one out")

    def test_stop(self) -> None:
        self.ready()
        self.runner.expiry.rest(now=self.fail, later=lambda: None)
        self.runner.stop()
        self.assertEqual(self.process.stops, 1)
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.assertEqual(self.roster.by_key, {}, "no new request finds it")
        self.assertEqual(self.roster.stopping(), [self.runner], "its slot and memory still count")
        self.assertRaises(IllegalMove, self.runner.stop)
        self.assertEqual(self.process.stops, 1, "a refused stop signals nothing")
        self.keeper.calls.clear()
        self.process.exit()
        self.assertIs(self.runner.state, State.ENDED)
        self.assertEqual(self.events.seen, [("loaded", 2.0), ("exited", "stopped")])
        self.assertEqual(self.keeper.calls, ["replan"])
        self.assertEqual(self.roster.stopping(), [])
        self.successResultOf(self.roster.when_empty())

    def test_a_failed_start_tells_the_loader_before_the_process_is_stopped(self) -> None:
        self.process.ready.errback(RunnerFailed("boom"))
        self.assertEqual(self.keeper.calls, ["failed: boom after 0 stops", "replan"])
        self.assertEqual(self.process.stops, 1)
        self.assertEqual(self.events.seen, [("load_failed",)])
        self.process.exit()
        self.assertEqual(self.events.seen, [("load_failed",), ("exited", "failed")])

    def test_a_start_that_fails_because_it_was_stopped_is_no_failure(self) -> None:
        self.runner.stop()  # the fake fails its start, as a real one does
        self.assertTrue(self.process.ready.called)
        self.assertEqual(self.keeper.calls, [])
        self.process.exit()
        self.assertEqual(self.events.seen, [("exited", "stopped")])

    def test_a_crash_while_ready_is_an_eviction(self) -> None:
        self.ready()
        self.runner.lease()
        self.process.exit()
        self.assertEqual(self.events.seen, [("loaded", 2.0), ("evicted", "crash"), ("exited", "crashed")])
        self.assertEqual(self.roster.by_key, {})
        self.runner.release()
        self.assertEqual(self.runner.in_use, 0, "a lease given back after the end still counts")

    def test_a_crash_while_draining_was_counted_when_it_began(self) -> None:
        self.ready()
        self.runner.lease()
        self.runner.drain()
        self.process.exit()
        self.assertEqual(self.events.seen, [("loaded", 2.0), ("exited", "crashed")])

    def test_refused_inputs_change_nothing(self) -> None:
        self.assertRaises(IllegalMove, self.runner.lease)
        self.assertRaises(IllegalMove, self.runner.release)
        self.assertRaises(IllegalMove, self.runner.drain)
        self.assertEqual((self.runner.state, self.runner.in_use), (State.LOADING, 0))
        self.assertEqual(self.events.seen, [])
