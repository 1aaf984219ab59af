"""Scenario 14's conversations and rows (bench/agents.py): each agent's conversation its own and growing,
a turn not answered 200 counted and failing its goal, the estimate held to the runner's peak memory."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from bench import agents
from bench.agents import FAILED, RATE, SLOWEST, Turn
from bench.report import Row


def row(rows: list[Row], start: str) -> Row:
    (found,) = [one for one in rows if one.target.startswith(start)]
    return found


class AgentsTests(SynchronousTestCase):
    def test_each_agent_has_its_own_notes_and_each_turn_adds_some(self) -> None:
        first = [agents.opening(agent)[1]["content"] for agent in range(agents.AGENTS)]
        self.assertEqual(len(set(first)), agents.AGENTS)
        later = agents.message(0, 1)["content"]
        self.assertLess(len(later), len(first[0]) / 5)
        self.assertNotIn(later, first[0])

    def test_figures_count_failed_turns_and_the_rate_over_the_wall_time(self) -> None:
        turns = [Turn(200, 3.0, 2000, 16), Turn(500, 0.5, 0, 0), Turn(200, 7.5, 2300, 16)]
        self.assertEqual(agents.figures(turns, 8.0), {FAILED: 1, RATE: 4.0, SLOWEST: 7.5})

    def test_the_goals(self) -> None:
        results = {
            "direct": {FAILED: 0, RATE: 2.0, SLOWEST: 80.0},
            "mrunner": {FAILED: 1, RATE: 1.7, SLOWEST: 121.5},
        }
        rows = agents.rows(results, {"direct": 920.0, "mrunner": 920.0}, 1_030_000_000, {})
        self.assertFalse(row(rows, "turns not 200").met())
        self.assertFalse(row(rows, "tokens/s").met(), "below 90% of direct")
        self.assertFalse(row(rows, "slowest turn").met(), "past 1.5 x 80 s + 1 s")
        self.assertFalse(row(rows, "memory estimate").met(), "1,030 MB is 12% over 920")
        results["mrunner"] = {FAILED: 0, RATE: 1.8, SLOWEST: 121.0}
        rows = agents.rows(results, {"direct": 920.0, "mrunner": 920.0}, 1_000_000_000, {})
        self.assertTrue(all(one.met() is not False for one in rows))
