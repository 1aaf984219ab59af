"""Fitting runners into GPUs and RAM together: L{placing.place}, L{policy.plan} with GPUs, the
llama-server flags a placement gives, the estimate's split per layer, what measurements correct
and the smaller plan a load out of device memory is retried with."""

from __future__ import annotations

from collections.abc import Mapping

import attrs
from hypothesis import given
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from mrunner.backends.llamacpp import arguments, sizing
from mrunner.runners.holding import held_on_gpus
from mrunner.scheduling import placing, policy, smaller
from mrunner.scheduling.order import LOADED, Rules
from mrunner.scheduling.policy import Limits, State
from mrunner.values import HOST, ContextSize, Footprint, Placement, place_on
from mrunner.values.backend import RunnerSettings
from tests.support import policy_views
from tests.support.fakes import model

GPUS = (("CUDA0", 24), ("CUDA1", 12))


@attrs.frozen
class Runner(policy_views.Runner):
    on_gpus: Mapping[str, int] = attrs.field(factory=dict)


@attrs.frozen
class Waiter:
    key: str
    footprint: Footprint = attrs.field(factory=lambda: Footprint(0))

    @property
    def memory(self) -> int:
        return self.footprint.total


def on(device: str, size: int, ram: int = 1, finished_at: float = 0.0, in_use: int = 0) -> Runner:
    return Runner(State.READY, in_use, 1, finished_at, ram, on_gpus={device: size})


#: 9 layers of 2 bytes, a compute buffer of 2 on each GPU, 1 in RAM whatever: 20 on one GPU.
MODEL = Footprint(host=1, layers=9, per_layer=2, per_device=2)


def layers(placement: Placement) -> str:
    return " ".join(f"{device}:{n}" for device, n in placement.layers) or "cpu"


# (why, room on each GPU, expected layers per GPU)
PLACES = [
    ("the GPU where it fits with the least to spare", {"CUDA0": 24, "CUDA1": 20}, "CUDA1:9"),
    ("the other when only it fits", {"CUDA0": 24, "CUDA1": 12}, "CUDA0:9"),
    ("spread in proportion to room", {"CUDA0": 12, "CUDA1": 12}, "CUDA0:5 CUDA1:4"),
    ("spread over the fewest GPUs", {"CUDA0": 18, "CUDA1": 6, "CUDA2": 6}, "CUDA0:7 CUDA1:2"),
    ("as many layers as fit, the rest on the CPU", {"CUDA0": 8, "CUDA1": 6}, "CUDA0:3 CUDA1:2"),
    ("a GPU without room for its buffer and a layer takes none", {"CUDA0": 3, "CUDA1": 0}, "cpu"),
]


class PlaceTests(SynchronousTestCase):
    def test_cases(self) -> None:
        for why, room, expected in PLACES:
            self.assertEqual(layers(placing.place(MODEL, room, list(room))), expected, why)

    def test_memory(self) -> None:
        """Each GPU holds its layers and a compute buffer; RAM the rest."""
        placement = placing.place(MODEL, {"CUDA0": 8, "CUDA1": 6}, ["CUDA0", "CUDA1"])
        self.assertEqual(dict(placement.memory), {HOST: 1 + 4 * 2, "CUDA0": 3 * 2 + 2, "CUDA1": 2 * 2 + 2})

    def test_nothing_to_offload(self) -> None:
        self.assertEqual(placing.place(Footprint(7), {"CUDA0": 99}, ["CUDA0"]), place_on(Footprint(7), {}))


def plan(runners: dict[str, Runner], queue: list[Waiter], ram: int = 100, **kwargs: object) -> policy.Plan:
    return policy.plan(queue, runners, [], Limits(8, ram, GPUS), **kwargs)  # type: ignore[arg-type]


def keys(items: tuple[object, ...]) -> str:
    return " ".join(getattr(item, "key", item) for item in items)  # type: ignore[misc]


# (why, runners, queue, RAM budget, expected load with its layers, evict, drain)
PLANS = [
    ("whole on the one GPU with room", {"a": on("CUDA1", 10)}, 100, ("b", "CUDA0:9"), "", ""),
    (
        "spread before an idle runner is evicted",
        {"a": on("CUDA0", 10)},
        100,
        ("b", "CUDA0:5 CUDA1:4"),
        "",
        "",
    ),
    (
        "an idle runner on the GPU goes for a whole fit",
        {"a": on("CUDA0", 20), "c": on("CUDA1", 10)},
        100,
        ("", ""),
        "a",
        "",
    ),
    (
        "a runner only in RAM is not evicted for a GPU's room",
        {"r": Runner(memory=5), "a": on("CUDA0", 20, finished_at=1.0), "c": on("CUDA1", 10, finished_at=2.0)},
        100,
        ("", ""),
        "a",
        "",
    ),
    (
        "a busy runner on the GPU drains",
        {"a": on("CUDA0", 20, in_use=1), "c": on("CUDA1", 10, in_use=1)},
        100,
        ("", ""),
        "",
        "a",
    ),
    (
        "RAM too small for a partial offload: the idle one goes",
        {"a": on("CUDA0", 20, ram=1), "c": on("CUDA1", 10)},
        4,
        ("", ""),
        "a",
        "",
    ),
]


class GpuPlanTests(SynchronousTestCase):
    def test_cases(self) -> None:
        for why, runners, ram, (load, placed), evict, drain in PLANS:
            decision = plan(runners, [Waiter("b", MODEL)], ram)
            self.assertEqual(keys(decision.load), load, why)
            self.assertEqual(" ".join(layers(p) for p in decision.placements), placed, why)
            self.assertEqual((keys(decision.evict), keys(decision.drain)), (evict, drain), why)

    def test_stopping_runners_hold_their_gpus(self) -> None:
        """What a stopping runner frees on a GPU is waited for, not taken twice."""
        decision = plan({}, [Waiter("b", MODEL)], stopping_gpus={"CUDA0": 20, "CUDA1": 10})
        self.assertEqual((decision.load, decision.evict), ((), ()))

    def test_a_spread(self) -> None:
        decision = plan({"a": on("CUDA0", 12), "c": on("CUDA1", 2)}, [Waiter("b", MODEL)])
        self.assertEqual([layers(p) for p in decision.placements], ["CUDA0:5 CUDA1:4"])

    def test_partial(self) -> None:
        """With every other runner pinned, as many layers as fit; the rest in RAM."""
        pinned = attrs.evolve(on("CUDA0", 18), pinned=True)
        decision = plan({"a": pinned, "c": attrs.evolve(on("CUDA1", 8), pinned=True)}, [Waiter("b", MODEL)])
        self.assertEqual([layers(p) for p in decision.placements], ["CUDA0:2 CUDA1:1"])
        self.assertEqual(decision.placements[0].in_ram, 1 + 6 * 2)


class HeldOnGpusTests(SynchronousTestCase):
    def test_the_largest_reading_per_device(self) -> None:
        """NVML counts the runtime's own context, which the load output leaves out; the plan is the floor."""
        planned, loaded, nvml = {"CUDA0": 20, "CUDA1": 9}, {"CUDA0": 26, HOST: 3}, {"CUDA0": 31, "CUDA1": 4}
        self.assertEqual(held_on_gpus(planned, loaded, nvml), {"CUDA0": 31, "CUDA1": 9})

    def test_without_nvml_as_before(self) -> None:
        self.assertEqual(held_on_gpus({"CUDA0": 20}, {"CUDA0": 26, HOST: 3}, {}), {"CUDA0": 26})


#: SmolLM2's default context (4096 tokens, trained for 8192) when the user fixed none.
UNFIXED = ContextSize(4096, 4096)
#: A footprint whose layers a retry capped already.
CAPPED = attrs.evolve(MODEL, offload=6)
Smaller = smaller.Smaller
# (why, the failing load's footprint, its GPU layers, its context if not fixed, the retry)
SMALLER = [
    ("a quarter fewer layers and half the context", MODEL, 9, UNFIXED, Smaller(offload=6, context=2048)),
    ("a context the user fixed is kept: fewer layers alone", MODEL, 9, None, Smaller(offload=6)),
    ("layers capped: half the context alone", CAPPED, 6, UNFIXED, Smaller(context=2048)),
    ("half the context when no layer was offloaded", MODEL, 0, UNFIXED, Smaller(context=2048)),
    ("retried already (capped, the context halved or fixed): give up", CAPPED, 6, None, None),
    ("never below 2048 tokens", CAPPED, 6, ContextSize(3000, 3000), Smaller(context=2048)),
    ("nothing smaller at 2048", CAPPED, 6, ContextSize(2048, 2048), None),
    ("down to a trained context under 2048", MODEL, 0, ContextSize(4096, 1024), Smaller(context=2048)),
    ("a trained context under 2048 is the floor", MODEL, 0, ContextSize(1536, 1024), Smaller(context=1024)),
]


class SmallerTests(SynchronousTestCase):
    def test_cases(self) -> None:
        for why, footprint, gpu_layers, context, expected in SMALLER:
            self.assertEqual(smaller.smaller(footprint, gpu_layers, context), expected, why)


gpu_runners = st.builds(
    Runner,
    state=st.sampled_from([State.LOADING, State.READY, State.DRAINING]),
    in_use=st.integers(0, 2),
    parallel=st.just(2),
    finished_at=st.floats(0, 100),
    memory=st.integers(0, 10),
    pinned=st.booleans(),
    on_gpus=st.fixed_dictionaries({"CUDA0": st.integers(0, 24), "CUDA1": st.integers(0, 12)}),
)
footprints = st.builds(Footprint, st.integers(0, 4), st.integers(0, 12), st.integers(0, 4), st.integers(0, 4))


class GpuPlanPropertyTests(SynchronousTestCase):
    """Whatever the state: no budget is overrun, a busy runner is never stopped, only drained."""

    @given(
        st.dictionaries(st.sampled_from("abcd"), gpu_runners, max_size=4),
        st.lists(st.builds(Waiter, st.sampled_from("abcdef"), footprints), max_size=6),
        st.integers(1, 4),
    )
    def test_invariants(self, runners: dict[str, Runner], queue: list[Waiter], slots: int) -> None:
        limits = Limits(slots, 20, GPUS)
        decision = policy.plan(queue, runners, [], limits)
        for key in decision.evict:
            self.assertEqual(runners[key].in_use, 0, "only idle runners are evicted")
            self.assertIs(runners[key].state, State.READY)
        for key in (*decision.evict, *decision.drain):
            self.assertFalse(runners[key].pinned)
        for key in decision.drain:
            self.assertIs(runners[key].state, State.READY)
        self.assertEqual(len(decision.placements), len(decision.load))
        if not decision.load:
            return
        kept = [r for key, r in runners.items() if key not in decision.evict]
        self.assertLessEqual(len(kept) + len(decision.load), slots)
        for device, budget in {HOST: 20, **dict(GPUS)}.items():
            held = sum(r.memory if device == HOST else r.on_gpus.get(device, 0) for r in kept)
            planned = sum(dict(p.memory).get(device, 0) for p in decision.placements)
            if planned:  # (runners drawn at random may hold more than a budget already)
                self.assertLessEqual(held + planned, budget, f"over {device}'s budget")
        for waiter, placement in zip(decision.load, decision.placements, strict=True):
            buffers = waiter.footprint.per_device * len(placement.on_gpus)
            self.assertEqual(
                placement.in_ram + sum(placement.on_gpus.values()), waiter.footprint.total + buffers
            )


class PlacementArgsTests(SynchronousTestCase):
    def test_whole(self) -> None:
        args = arguments.placement_args(place_on(MODEL, {"CUDA1": 9}))
        self.assertEqual(args, ["--fit", "off", "--device", "CUDA1", "--n-gpu-layers", "9"])

    def test_spread(self) -> None:
        args = arguments.placement_args(place_on(MODEL, {"CUDA0": 5, "CUDA1": 4}), draft=True)
        expected = ["--fit", "off", "--device", "CUDA0,CUDA1", "--n-gpu-layers", "9"]
        expected += ["--tensor-split", "5,4"]
        self.assertEqual(args, [*expected, "--gpu-layers-draft", "0"])

    def test_cpu_only(self) -> None:
        """On a GPU machine, a runner planned for RAM alone is told to offload nothing."""
        args = arguments.placement_args(place_on(MODEL, {}))
        self.assertEqual(args, ["--fit", "off", "--device", "none", "--n-gpu-layers", "0"])


class FootprintTests(SynchronousTestCase):
    def test_split_adds_up(self) -> None:
        """On the CPU the split is the whole estimate; a layer is its share of weights and KV cache."""
        path = self.mktemp()
        with open(path, "wb") as f:
            f.write(b"\0" * 310_000)
        metadata = {
            "general.architecture": "llama",
            "llama.block_count": 30,
            "llama.embedding_length": 576,
            "llama.attention.head_count": 9,
            "llama.attention.head_count_kv": 3,
        }
        described = attrs.evolve(model(), config={"gguf": metadata}, gguf=path)
        settings = RunnerSettings(context_size=4096)
        footprint = sizing.footprint(described, settings)
        self.assertEqual(footprint.total, sizing.memory_estimate(described, settings))
        kv = 30 * 4096 * 3 * (64 + 64) * 2
        self.assertEqual((footprint.layers, footprint.per_layer), (31, (310_000 + kv) // 31))
        self.assertGreater(footprint.per_device, 0)

    def test_no_metadata(self) -> None:
        """Nothing known of its layers: nothing to offload, the whole estimate in RAM."""
        footprint = sizing.footprint(model(), RunnerSettings())
        self.assertEqual(
            (footprint.layers, footprint.total), (0, sizing.memory_estimate(model(), RunnerSettings()))
        )


class LoadedOrderPlacementTests(SynchronousTestCase):
    """Under C{order = "loaded"}, a waiter whose best placement needs a busy runner's GPU waits for
    it until it is overdue, rather than loading now with fewer layers for its runner's life."""

    def test_waits_for_the_busy_gpu_then_takes_it_whole(self) -> None:
        @attrs.frozen
        class Waiting(Waiter):
            priority: int = 1
            since: float = 0.0

        runners = {"a": attrs.evolve(on("CUDA0", 20, in_use=1), parallel=1)}
        limits = Limits(4, 100, (("CUDA0", 24),))
        rules = Rules(LOADED, max_wait=15)
        early = policy.plan([Waiting("b", MODEL)], runners, [], limits, now=5, rules=rules)
        self.assertEqual((early.load, early.drain), ((), ()), "not loaded beside a on the CPU")
        late = policy.plan([Waiting("b", MODEL)], runners, [], limits, now=15, rules=rules)
        self.assertEqual(late.drain, ("a",))
