"""The runner's machine: the table's moves, every other input refused, each output once, on a real record."""

from __future__ import annotations

from pathlib import Path

import attrs
from twisted.internet.task import Clock
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from mrunner.errors import RunnerFailed
from mrunner.moves import Moves
from mrunner.runners.lifecycle import MACHINE, Effects, IllegalMove, Input, Output, Stage, step
from mrunner.runners.runner import Runner
from mrunner.scheduling.roster import Roster
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

    stage: Stage
    calls: list[str] = attrs.field(factory=list)

    def __getattr__(self, name: str) -> object:
        if name in {output.value for output in Output}:
            return lambda: self.calls.append(name)
        raise AttributeError(name)


def recorder(stage: Stage) -> Effects:
    return Recorder(stage)  # type: ignore[return-value]


class TableTests(SynchronousTestCase):
    def test_each_move_runs_its_outputs_once_in_order(self) -> None:
        for (stage, input), move in MACHINE.items():
            core = Recorder(stage)
            step(core, input)  # type: ignore[arg-type]
            self.assertEqual(core.stage, move.to, (stage, input))
            self.assertEqual(core.calls, [output.value for output in move.outputs], (stage, input))
            self.assertEqual(len(set(core.calls)), len(core.calls), "no output twice in one move")

    def test_every_other_input_is_refused_and_changes_nothing(self) -> None:
        refused = 0
        for stage in Stage:
            for input in Input:
                if (stage, input) in MACHINE:
                    continue
                core = Recorder(stage)
                self.assertRaises(IllegalMove, step, core, input)
                self.assertEqual((core.stage, core.calls), (stage, []), (stage, input))
                refused += 1
        self.assertEqual(refused, len(Stage) * len(Input) - len(MACHINE))
        self.assertGreater(refused, 0)

    def test_the_diagram(self) -> None:
        """The documented ways through, and a few that are not."""
        legal = [
            ((Input.ANSWER,), Stage.READY),
            ((Input.UNHEALTHY, Input.SPOKE, Input.POLL, Input.ANSWER), Stage.READY),
            ((Input.STOP, Input.END), Stage.ENDED),
            ((Input.STOP, Input.GRACE_OVER, Input.END), Stage.ENDED),
            ((Input.FAIL, Input.END), Stage.ENDED),
            ((Input.TIME_OUT, Input.GRACE_OVER, Input.END), Stage.ENDED),
            ((Input.END,), Stage.ENDED),
            ((Input.ANSWER, Input.LEASE, Input.DRAIN, Input.RELEASE, Input.STOP), Stage.STOPPING),
            ((Input.ANSWER, Input.LEASE, Input.END, Input.RELEASE), Stage.ENDED),
            ((Input.ANSWER, Input.REST, Input.RETIME, Input.EXPIRE, Input.END), Stage.ENDED),
            ((Input.REST, Input.RETIME, Input.ANSWER), Stage.READY),
        ]
        for inputs, stage in legal:
            core = Recorder(Stage.NEW)
            for input in (Input.START, *inputs):
                step(core, input)  # type: ignore[arg-type]
            self.assertEqual(core.stage, stage, inputs)
        illegal = [
            (Stage.NEW, Input.ANSWER),
            (Stage.NEW, Input.STOP),
            (Stage.LOADING, Input.START),
            (Stage.LOADING, Input.GRACE_OVER),
            (Stage.READY, Input.POLL),
            (Stage.READY, Input.TIME_OUT),
            (Stage.LOADING, Input.LEASE),
            (Stage.LOADING, Input.DRAIN),
            (Stage.LOADING, Input.EXPIRE),
            (Stage.READY, Input.ANSWER),
            (Stage.DRAINING, Input.LEASE),
            (Stage.DRAINING, Input.DRAIN),
            (Stage.DRAINING, Input.EXPIRE),
            (Stage.FAILING, Input.FAIL),
            (Stage.FAILING, Input.STOP),
            (Stage.STOPPING, Input.STOP),
            (Stage.STOPPING, Input.ANSWER),
            (Stage.STOPPING, Input.FAIL),
            (Stage.STOPPING, Input.REST),
            (Stage.ENDED, Input.END),
            (Stage.ENDED, Input.STOP),
        ]
        for stage, input in illegal:
            self.assertRaises(IllegalMove, step, recorder(stage), input)

    def test_the_stages_states(self) -> None:
        """A failing runner shows as stopping: its slot and memory count until it ends."""
        self.assertEqual(
            {stage: stage.state for stage in Stage},
            {
                Stage.NEW: State.LOADING,
                Stage.LOADING: State.LOADING,
                Stage.READY: State.READY,
                Stage.DRAINING: State.DRAINING,
                Stage.FAILING: State.STOPPING,
                Stage.STOPPING: State.STOPPING,
                Stage.ENDED: State.ENDED,
            },
        )

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


class RunnerCase(SynchronousTestCase):
    """One runner in a roster, its process a fake that the test makes ready or end."""

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


class RunnerTests(RunnerCase):
    """The runner's outputs do what they say, once: the process, the clock, the slots, the events."""

    def test_ready(self) -> None:
        self.ready()
        self.assertIs(self.runner.state, State.READY)
        self.assertEqual(self.events.seen, [("loaded", 2.0)])
        self.assertEqual(self.keeper.calls, ["opened", "replan"])
        self.assertEqual(self.runner.finished_at, 2.0)

    def test_slots_and_the_keep_alive_clock(self) -> None:
        self.ready()
        self.runner.rest()
        self.assertEqual(self.runner.expires_at, 12.0)
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
        self.runner.rest()
        self.runner.stop()
        self.assertEqual(self.process.stops, 1)
        self.assertEqual([call.getTime() for call in self.clock.getDelayedCalls()], [7.0], "its grace only")
        self.assertEqual(self.roster.by_key, {}, "no new request finds it")
        self.assertEqual(self.roster.stopping(), [self.runner], "its slot and memory still count")
        self.assertRaises(IllegalMove, self.runner.stop)
        self.assertEqual(self.process.stops, 1, "a refused stop signals nothing")
        self.keeper.calls.clear()
        self.process.exit()
        self.assertIs(self.runner.state, State.ENDED)
        self.assertEqual(self.clock.getDelayedCalls(), [], "no grace left")
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
        self.runner.stop()
        self.process.ready.errback(RunnerFailed("the answer to a probe sent before"))
        self.assertEqual(self.keeper.calls, [])
        self.assertEqual([c.getTime() for c in self.clock.getDelayedCalls()], [5.0], "no deadline: its grace")
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


class KeepAliveTests(RunnerCase):
    """The keep-alive timer is the machine's: armed on C{rest}, cancelled by its moves, C{expire} its end."""

    def test_it_runs_out_while_idle(self) -> None:
        self.ready()
        self.runner.rest()
        self.runner.rest()
        self.assertEqual(len(self.clock.getDelayedCalls()), 1, "one timer, however often it rests")
        self.keeper.calls.clear()
        self.clock.advance(10)
        self.assertIs(self.runner.state, State.STOPPING)
        self.assertEqual(self.process.stops, 1)
        self.assertEqual(self.events.seen, [("loaded", 2.0), ("evicted", "idle")])
        self.assertEqual((self.roster.by_key, self.keeper.calls), ({}, ["replan"]))
        self.process.exit()
        self.assertEqual(self.events.seen[-1], ("exited", "stopped"))

    def test_none_runs_while_busy_loading_or_draining(self) -> None:
        self.runner.rest()
        self.ready()
        self.runner.lease()
        self.runner.rest()
        self.assertEqual((self.runner.expires_at, self.clock.getDelayedCalls()), (None, []))
        self.runner.drain()
        self.runner.release()
        self.runner.rest()
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_a_keep_alive_of_zero_expires_at_once_and_minus_one_never(self) -> None:
        self.ready()
        self.runner.retime(keep_alive=-1)
        self.assertEqual((self.runner.keep_alive, self.clock.getDelayedCalls()), (-1, []))
        self.runner.retime(keep_alive=0)
        self.assertIs(self.runner.state, State.STOPPING)
        self.assertEqual(self.events.seen[-1], ("evicted", "idle"))

    def test_retime_and_pin_start_the_clock_again(self) -> None:
        self.ready()
        self.runner.rest()
        self.clock.advance(5)
        self.runner.retime(keep_alive=20)
        self.assertEqual((self.runner.keep_alive, self.runner.expires_at), (20, 27.0))
        self.runner.retime(pinned=True)
        self.assertEqual((self.runner.pinned, self.runner.expires_at), (True, None))
        self.runner.retime(pinned=False)
        self.assertEqual((self.runner.keep_alive, self.runner.expires_at), (20, 27.0))

    def test_a_lease_may_bring_its_keep_alive(self) -> None:
        self.ready()
        self.runner.lease(keep_alive=60)
        self.runner.lease()
        self.assertEqual(self.runner.keep_alive, 60, "a lease without one keeps the last")
        self.runner.release()
        self.runner.release()
        self.runner.rest()
        self.assertEqual(self.runner.expires_at, 62.0)

    def test_terms_wait_for_the_runner_while_it_loads(self) -> None:
        self.runner.retime(keep_alive=1, pinned=True)
        self.assertEqual((self.runner.keep_alive, self.runner.pinned), (1, True))
        self.assertRaises(IllegalMove, self.runner.lease, 99)
        self.ready()
        self.runner.lease()
        self.assertEqual(self.runner.keep_alive, 1, "a refused lease brought nothing")


class LoadingTests(RunnerCase):
    """Readiness is the machine's: its deadline, its health polls, and the grace after SIGTERM."""

    def test_started_with_a_probe_and_a_deadline(self) -> None:
        self.assertTrue(self.process.started)
        self.assertIs(self.runner.stage, Stage.LOADING)
        self.assertEqual([c.getTime() for c in self.clock.getDelayedCalls()], [3600.0])

    def test_the_deadline(self) -> None:
        self.clock.advance(3600)
        self.assertIs(self.runner.stage, Stage.FAILING)
        error = "runner was not ready after 3600s; raise [scheduler] load_timeout"
        self.assertEqual(self.keeper.calls, [f"failed: {error} after 0 stops", "replan"])
        self.assertEqual((self.process.stops, self.roster.by_key), (1, {}))
        self.process.ready.callback(None)
        self.assertIs(self.runner.stage, Stage.FAILING, "a late answer changes nothing")
        self.clock.advance(5)
        self.assertEqual(self.process.kills, 1, "SIGKILL once its grace is over")
        self.process.exit()
        self.assertEqual(self.events.seen, [("load_failed",), ("exited", "failed")])
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_an_end_while_loading_is_a_failed_start(self) -> None:
        self.process.exit()
        self.assertIs(self.runner.stage, Stage.ENDED)
        error = "runner exited with code 1 before it was ready"
        self.assertEqual(self.keeper.calls, [f"failed: {error} after 0 stops", "replan"])
        self.assertEqual(self.events.seen, [("load_failed",), ("exited", "failed")])
        self.assertEqual(self.clock.getDelayedCalls(), [], "no deadline left")

    def test_a_stop_while_loading_ends_its_timers(self) -> None:
        self.runner.stop()
        self.assertEqual([c.getTime() for c in self.clock.getDelayedCalls()], [5.0])
        self.process.exit()
        self.assertEqual(self.events.seen, [("exited", "stopped")])
        self.assertEqual(self.clock.getDelayedCalls(), [])


class DocumentedTests(SynchronousTestCase):
    def test_the_architecture_page_shows_every_move(self) -> None:
        page = (Path(__file__).parents[2] / "docs" / "architecture.md").read_text()
        for (stage, input), move in MACHINE.items():
            outputs = ", ".join(output.value for output in move.outputs) or "—"
            row = f"| {stage.value} | {input.value} | {move.to.value} | {outputs} |"
            self.assertIn(row, page, "docs/architecture.md's table of the runner machine")
