"""The live router: whole tokens, conserved per expert, the whole-token optimum on chain layouts and close to the
exact per-step optimum elsewhere, the numpy split's twin before rounding, compiled whole, and strict about its
inputs."""

import numpy as np
import pytest
import torch

from placement import ClusterSpec, Placement, PlacementFormatError, fit_placement, score_placement
from placement.drift_swaps import ring_spans
from placement.policies.chain_layout import chain_layout
from placement.policies.deepseek import replicate_greedy
from placement.routing.chain_split import _span_classes
from placement.routing.dynamic_split import MOMENTUM, ROUTER_ROUNDS, ReplicaGraph, optimal_split
from placement.routing.live_router import DEFAULT_ROUNDS, LayerRoutingTable, fractional_split, route_step


def fitted_layer(num_gpus: int, slots: int, num_experts: int, seed: int) -> tuple[Placement, np.ndarray]:
    rng = np.random.default_rng(seed)
    popularity = rng.lognormal(0, 1.0, size=num_experts)
    popularity /= popularity.sum()
    history = rng.multinomial(64 * num_gpus * 20, popularity, size=(1, 1))
    placement = fit_placement("deepseek", history, ClusterSpec(num_gpus=num_gpus, slots_per_gpu=slots))
    return placement, rng.multinomial(64 * num_gpus, popularity, size=16)


@pytest.mark.parametrize("num_gpus, slots, num_experts", [(16, 5, 64), (32, 3, 64)], ids=["16x5", "32x3"])
def test_router_conserves_every_experts_tokens_in_whole_tokens(num_gpus, slots, num_experts):
    placement, steps = fitted_layer(num_gpus, slots, num_experts, seed=1)
    table = LayerRoutingTable.build(placement.phy2log_LP[0], slots, num_experts)
    for counts in steps:
        tokens_P = route_step(torch.as_tensor(counts), table)
        assert tokens_P.dtype == torch.int64 and (tokens_P >= 0).all()
        per_expert = np.bincount(placement.phy2log_LP[0], tokens_P.numpy(), minlength=num_experts)
        np.testing.assert_array_equal(per_expert, counts)


@pytest.mark.parametrize("num_gpus, slots, num_experts", [(16, 5, 64), (32, 3, 64)], ids=["16x5", "32x3"])
def test_router_is_close_to_the_exact_lp_optimum_on_sampled_steps(exact_lp_max_load, num_gpus, slots, num_experts):
    placement, steps = fitted_layer(num_gpus, slots, num_experts, seed=2)
    table = LayerRoutingTable.build(placement.phy2log_LP[0], slots, num_experts)
    ratios = []
    for counts in steps:
        busiest = route_step(torch.as_tensor(counts), table).view(num_gpus, slots).sum(1).max().item()
        exact = exact_lp_max_load(counts.astype(float), placement.phy2log_LP[0], placement.gpu_of_slot_P, num_gpus)
        assert busiest >= np.floor(exact)  # whole tokens can beat the fractional optimum by less than one token
        ratios.append(busiest / exact)
    # Measured: mean 1.005 (16x5), 1.024 (32x3, 64 tokens per GPU, where one whole token is 1.6%)
    assert np.mean(ratios) < 1.03 and np.max(ratios) < 1.08


def test_router_beats_the_static_equal_split_on_a_skewed_step():
    # Expert 0 lives on GPUs 0 and 1; GPU 0 also holds the hot expert 1, so expert 0 should go to GPU 1.
    phy2log = np.array([0, 1, 0, 2])
    table = LayerRoutingTable.build(phy2log, 2, 3)
    tokens_P = route_step(torch.tensor([40, 30, 10]), table, rounds=40)
    assert tokens_P.tolist() == [10, 30, 30, 10]


@pytest.mark.parametrize("exact_chains", [True, False], ids=["chain", "water-filling"])
def test_router_keeps_experts_without_spare_replicas_in_place_and_uses_one_slot_per_gpu(exact_chains):
    # Expert 0 has two replicas on GPU 0 (slots 0 and 1): its tokens go to its first slot there. No expert spans
    # two GPUs, so both methods have nothing to move.
    phy2log = np.array([0, 0, 1, 2])
    table = LayerRoutingTable.build(phy2log, 2, 3, exact_chains=exact_chains)
    assert route_step(torch.tensor([7, 5, 3]), table).tolist() == [7, 0, 5, 3]


def test_router_returns_every_slot_when_the_last_slot_holds_a_second_replica_on_the_same_gpu():
    # DeepSeek's greedy makes such layouts: expert 2 fills both slots of GPU 1, so no first slot is slot 3.
    phy2log = np.array([0, 1, 2, 2])
    counts = np.array([5, 7, 9])
    tokens_P = route_step(torch.as_tensor(counts), LayerRoutingTable.build(phy2log, 2, 3))
    assert tokens_P.shape == (4,)
    np.testing.assert_array_equal(np.bincount(phy2log, tokens_P.numpy(), minlength=3), counts)
    placement = Placement.equal_split(phy2log[None], ClusterSpec(num_gpus=2, slots_per_gpu=2), 3)
    live = score_placement(placement, counts[None, None], "live")
    assert live.imbalance_TL[0, 0] == pytest.approx(12 / 10.5)


def _random_layout(rng: np.random.Generator, num_gpus: int, slots: int, num_experts: int) -> np.ndarray:
    """Every expert once, the spare slots to random experts, shuffled (two replicas may share a GPU)."""
    extra = rng.integers(0, num_experts, size=num_gpus * slots - num_experts)
    return rng.permutation(np.concatenate([np.arange(num_experts), extra]))


def _chain(rng: np.random.Generator, num_gpus: int, slots: int, num_experts: int) -> np.ndarray:
    load_E = rng.lognormal(0, 1.0, size=num_experts)
    _, _, replicas_BE = replicate_greedy(load_E[None], num_gpus * slots)
    return chain_layout(load_E, replicas_BE[0], num_gpus, slots, "random", seed=int(rng.integers(100)))


def _unequal_weights(rng: np.random.Generator, phy2log_P: np.ndarray, num_experts: int) -> np.ndarray:
    raw = rng.uniform(0.2, 1.0, size=len(phy2log_P))
    return raw / np.bincount(phy2log_P, raw, minlength=num_experts)[phy2log_P]


@pytest.mark.parametrize("weights", ["equal", "unequal"], ids=["equal-weights", "unequal-weights"])
@pytest.mark.parametrize("layout", [_random_layout, _chain], ids=["random", "chain"])
def test_router_split_before_rounding_is_the_numpy_split_with_the_same_rounds(layout, weights):
    num_gpus, slots, num_experts = 12, 3, 24
    for seed in range(3):
        rng = np.random.default_rng(seed)
        phy2log = layout(rng, num_gpus, slots, num_experts)
        weights_P = _unequal_weights(rng, phy2log, num_experts) if weights == "unequal" else None
        gpu_of_slot = np.arange(len(phy2log)) // slots
        graph = ReplicaGraph.build(phy2log, gpu_of_slot, num_experts, num_gpus, weights_P)
        # Water-filling on every layout: chains would otherwise take the exact split, which has no rounds.
        table = LayerRoutingTable.build(phy2log, slots, num_experts, weights_P=weights_P, exact_chains=False)
        counts_BE = rng.multinomial(32 * num_gpus, rng.dirichlet(np.ones(num_experts)), size=4)
        # -inf tolerance: no step leaves the batch early, so numpy runs exactly the router's rounds.
        share_BMY, loads_BG, _ = optimal_split(counts_BE, graph, -np.inf, ROUTER_ROUNDS, MOMENTUM)
        valid_MY = graph.gpus_MY < num_gpus
        fixed_G = counts_BE @ graph.fixed_EG
        for counts, numpy_share_MY, numpy_loads_G, fixed in zip(counts_BE, share_BMY, loads_BG, fixed_G):
            share_MY = fractional_split(torch.as_tensor(counts), table).double().numpy()
            loads_G = fixed + np.bincount(graph.gpus_MY[valid_MY], share_MY[valid_MY], minlength=num_gpus)
            np.testing.assert_allclose(loads_G, numpy_loads_G, rtol=1e-4)
            np.testing.assert_allclose(share_MY, numpy_share_MY, atol=1e-4 * counts.max())
            # Rounding moves each replica's share by less than one token.
            tokens_P = route_step(torch.as_tensor(counts), table).numpy()
            source_P = table.source_P.numpy() - num_experts  # slot p takes entry source_P[p] of share_MY, if in range
            takes = (source_P >= 0) & (source_P < share_MY.size)
            assert takes.sum() == valid_MY.sum()
            assert np.abs(tokens_P[takes] - share_MY.reshape(-1)[source_P[takes]]).max() < 1 + 1e-4


def _turned_chain(rng: np.random.Generator, num_gpus: int, slots: int, num_experts: int) -> np.ndarray:
    """A chain layout turned around the ring by a random number of GPUs: still a chain, cut elsewhere."""
    return np.roll(_chain(rng, num_gpus, slots, num_experts), slots * int(rng.integers(num_gpus)))


@pytest.mark.parametrize(
    "num_gpus, slots, num_experts",
    [(16, 3, 32), (12, 5, 48), (16, 3, 40), (10, 4, 34)],
    ids=["ring-16x3", "ring-12x5", "path-16x3", "path-10x4"],
)
def test_router_gives_the_whole_token_optimum_on_chain_layouts(exact_lp_max_load, num_gpus, slots, num_experts):
    # G * (S - 1) experts: the replicated experts link every pair of neighbouring GPUs once (a ring); more experts
    # leave some pairs unlinked (a path).
    rng = np.random.default_rng(num_gpus * slots)
    for _ in range(3):
        phy2log = _turned_chain(rng, num_gpus, slots, num_experts)
        steps = rng.multinomial(24 * num_gpus, rng.dirichlet(np.full(num_experts, 0.3)), size=5)
        _assert_chain_split_is_the_whole_token_optimum(exact_lp_max_load, phy2log, slots, steps)


@pytest.mark.parametrize(
    "num_gpus, slots, num_experts", [(16, 3, 32), (12, 5, 48), (10, 4, 34)], ids=["ring-16x3", "ring-12x5", "path-10x4"]
)
def test_router_finds_the_chain_in_a_layout_whose_gpus_were_relabelled(exact_lp_max_load, num_gpus, slots,
                                                                       num_experts):
    # A migration realises a target's GPU j on another physical GPU: the chain is then no longer in GPU order,
    # but the order its experts force is found and the split is still the whole-token optimum.
    rng = np.random.default_rng(num_gpus + slots)
    for _ in range(3):
        chain = _turned_chain(rng, num_gpus, slots, num_experts)
        relabelled = chain.reshape(num_gpus, slots)[rng.permutation(num_gpus)].reshape(-1)
        assert ring_spans(relabelled, num_experts, num_gpus, slots) is None  # no longer a chain in GPU order
        steps = rng.multinomial(24 * num_gpus, rng.dirichlet(np.full(num_experts, 0.3)), size=5)
        _assert_chain_split_is_the_whole_token_optimum(exact_lp_max_load, relabelled, slots, steps)


def test_router_finds_a_ring_of_two_experts_that_meet_at_both_ends(exact_lp_max_load):
    # Expert 0 spans GPUs 0, 1, 2 and expert 1 GPUs 0, 1, 3: they meet at GPUs 0 and 1, so the ring is 0, 2, 1, 3
    # (expert 0 on the arc 0-2-1, expert 1 on 1-3-0); GPU order 0, 1, 2, 3 is no chain.
    phy2log = np.array([0, 1, 0, 1, 0, 2, 1, 3])
    rng = np.random.default_rng(2)
    steps = rng.multinomial(30, rng.dirichlet(np.full(4, 0.5)), size=8)
    _assert_chain_split_is_the_whole_token_optimum(exact_lp_max_load, phy2log, 2, steps)


def test_router_passes_a_hot_gpus_load_around_the_ring():
    # GPU g holds one-GPU expert g and the experts linking it to its neighbours: 4 + g (GPUs g, g+1) and 4 + (g-1).
    # Expert 0 (12 tokens) pins GPU 0; the links (10 tokens each) move their tokens away from it around the ring,
    # until every GPU carries 52 / 4 = 13.
    phy2log = np.array([0, 4, 7, 1, 4, 5, 2, 5, 6, 3, 6, 7])
    table = LayerRoutingTable.build(phy2log, 3, 8)
    assert table.method == "chain"
    tokens_P = route_step(torch.tensor([12, 0, 0, 0, 10, 10, 10, 10]), table)
    assert tokens_P.view(4, 3).sum(1).tolist() == [13, 13, 13, 13]


def _shared_links(rng: np.random.Generator, num_gpus: int, per_link: int, fixed_per_gpu: int) -> np.ndarray:
    """A ring (a path on 2 GPUs) whose every link (g, g+1) carries `per_link` experts, plus one-GPU experts."""
    links = num_gpus if num_gpus > 2 else 1
    linking = np.arange(links * per_link).reshape(links, per_link)
    fixed = links * per_link + np.arange(num_gpus * fixed_per_gpu).reshape(num_gpus, fixed_per_gpu)
    rows = [np.concatenate([linking[g % links], linking[(g - 1) % links] if num_gpus > 2 else [], fixed[g]])
            for g in range(num_gpus)]
    relabel = rng.permutation(int(fixed.max()) + 1)
    return relabel[np.concatenate(rows).astype(np.int64)]


@pytest.mark.parametrize("num_gpus, per_link", [(2, 3), (2, 6), (4, 2), (8, 3)])
def test_router_splits_experts_sharing_their_gpus_as_one_and_exactly(exact_lp_max_load, num_gpus, per_link):
    # Experts spanning the same GPUs are interchangeable: split as one class, then laid over the members. Every
    # 2-GPU layout is such a chain; so is a ring whose links each carry several experts.
    rng = np.random.default_rng(num_gpus * per_link)
    phy2log = _shared_links(rng, num_gpus, per_link, fixed_per_gpu=3)
    num_experts = int(phy2log.max()) + 1
    steps = rng.multinomial(20 * num_gpus, rng.dirichlet(np.full(num_experts, 0.3)), size=6)
    _assert_chain_split_is_the_whole_token_optimum(exact_lp_max_load, phy2log, len(phy2log) // num_gpus, steps)


def _assert_chain_split_is_the_whole_token_optimum(exact_lp_max_load, phy2log: np.ndarray, slots: int,
                                                   steps_BE: np.ndarray) -> None:
    """The layout routes by the chain split, and on every step (and an empty one) its busiest GPU carries the
    ceiling of the LP optimum, every expert's tokens kept."""
    num_experts, num_gpus = steps_BE.shape[1], len(phy2log) // slots
    gpu_of_slot = np.arange(len(phy2log)) // slots
    table = LayerRoutingTable.build(phy2log, slots, num_experts)
    assert table.method == "chain"
    for counts in np.vstack([steps_BE, np.zeros(num_experts, dtype=np.int64)]):
        tokens_P = route_step(torch.as_tensor(counts), table).numpy()
        assert (tokens_P >= 0).all()
        np.testing.assert_array_equal(np.bincount(phy2log, tokens_P, minlength=num_experts), counts)
        exact = exact_lp_max_load(counts.astype(float), phy2log, gpu_of_slot, num_gpus) if counts.any() else 0
        assert tokens_P.reshape(num_gpus, slots).sum(1).max() == np.ceil(exact - 1e-6)


def test_router_splits_an_expert_on_every_gpu_exactly():
    # Expert 0 on all four GPUs, the only expert that moves: one class spanning the whole ring.
    phy2log = np.array([0, 1, 0, 2, 0, 3, 0, 4])
    table = LayerRoutingTable.build(phy2log, 2, 5)
    assert table.method == "chain"
    counts = torch.tensor([10, 2, 0, 1, 1])
    tokens_P = route_step(counts, table)
    assert tokens_P[phy2log == 0].sum() == 10 and torch.equal(tokens_P[phy2log != 0], counts[1:])
    assert tokens_P.view(4, 2).sum(1).max() == 4  # 14 tokens over 4 GPUs


@pytest.mark.parametrize(
    "phy2log",
    [
        np.array([0, 2, 0, 1, 0, 3, 1, 4, 2, 5, 3, 6]),
        np.array([2, 3, 0, 1, 0, 1, 0, 4]),
        np.array([0, 1, 0, 2, 0, 3, 0, 1]),
    ],
    ids=["middle-gpu-shared", "nested-arcs", "every-gpu-and-a-link"],
)
def test_router_falls_back_to_water_filling_where_the_layout_is_not_a_chain(phy2log):
    num_experts = phy2log.max() + 1
    table = LayerRoutingTable.build(phy2log, 2, num_experts)
    assert table.method == "water-filling"
    counts = np.array([9, 4, 0, 7, 3, 1, 5])[:num_experts]
    tokens_P = route_step(torch.as_tensor(counts), table).numpy()
    np.testing.assert_array_equal(np.bincount(phy2log, tokens_P, minlength=num_experts), counts)


@pytest.mark.parametrize("num_gpus, width", [(4, 3), (16, 4), (128, 5), (300, 8)], ids=["4", "16", "128", "300-rows"])
def test_span_classes_are_the_distinct_rows_numpy_finds(num_gpus, width):
    # One 1-D unique on row keys stands in for numpy's unique over rows; 300 GPUs x 8 overflows the key and takes
    # numpy's path.
    rng = np.random.default_rng(num_gpus)
    for _ in range(20):
        rows_MY = np.sort(rng.integers(0, num_gpus + 1, size=(rng.integers(1, 60), width)), axis=1)
        rows_MY = rows_MY[rng.integers(0, len(rows_MY), size=2 * len(rows_MY))]  # with repeats
        classes_CY, class_M = _span_classes(rows_MY, num_gpus)
        want_CY, want_M = np.unique(rows_MY, axis=0, return_inverse=True)
        np.testing.assert_array_equal(classes_CY, want_CY)
        np.testing.assert_array_equal(class_M, want_M.reshape(-1))


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # from inside torch's inductor
def test_router_compiles_whole_and_gives_the_eager_tokens():
    # fullgraph=True fails on any graph break: the per-step path has no host synchronisation and no data-dependent
    # shape, so CUDA graphs can capture it. Two compiles (about 15 s each on CPU): the exact chain split, and
    # water-filling (2 rounds keep its compile short; more rounds unroll the same operations).
    compiled = torch.compile(route_step, fullgraph=True)
    rng = np.random.default_rng(7)
    phy2log = _chain(rng, 16, 3, 32)
    steps = rng.multinomial(24 * 16, rng.dirichlet(np.full(32, 0.3)), size=6)
    for exact_chains, rounds in ((True, DEFAULT_ROUNDS), (False, 2)):
        table = LayerRoutingTable.build(phy2log, 3, 32, exact_chains=exact_chains)
        assert table.method == ("chain" if exact_chains else "water-filling")
        for counts in steps:
            counts_E = torch.as_tensor(counts, dtype=torch.int32)
            eager = route_step(counts_E, table, rounds, check_values=False)
            assert torch.equal(compiled(counts_E, table, rounds, check_values=False), eager)


def test_router_gives_the_same_tokens_when_the_caller_vouches_for_its_counts():
    placement, steps = fitted_layer(8, 4, 20, seed=3)
    table = LayerRoutingTable.build(placement.phy2log_LP[0], 4, 20)
    for counts in steps:
        checked = route_step(torch.as_tensor(counts), table)
        vouched = route_step(torch.as_tensor(counts, dtype=torch.int32), table, check_values=False)
        assert torch.equal(checked, vouched)


@pytest.mark.parametrize(
    "phy2log, slots, weights, match",
    [
        (np.array([[0, 1], [2, 0]]), 2, None, "phy2log_P must be a 1-D integer array"),
        (np.array([0.0, 1.0, 2.0, 0.0]), 2, None, "phy2log_P must be a 1-D integer array"),
        (np.array([0, 1, 2]), 2, None, "not a positive multiple of slots_per_gpu=2"),
        (np.array([0, 1, 2, 0]), 0, None, "slots_per_gpu must be a positive integer"),
        (np.array([0, 1, 3, 0]), 2, None, r"expected \[0, 3\)"),
        (np.array([0, 1, -1, 2]), 2, None, r"expected \[0, 3\)"),
        (np.array([0, 1, 0, 1]), 2, None, "expert 2 has no slot in phy2log_P"),
        (np.array([0, 1, 0, 2]), 2, np.ones(3), "weights_P must have shape"),
        (np.array([0, 1, 0, 2]), 2, np.array([0.5, 1.0, np.nan, 1.0]), "weights_P must be finite and >= 0"),
        (np.array([0, 1, 0, 2]), 2, np.array([1.5, 1.0, -0.5, 1.0]), "weights_P must be finite and >= 0"),
        (np.array([0, 1, 0, 2]), 2, np.array([0.5, 1.0, 0.4, 1.0]), "weights_P must sum to 1"),
    ],
    ids=["2d-slot-map", "float-slot-map", "partial-gpu", "no-slots-per-gpu", "expert-id-too-large",
         "negative-expert-id", "expert-without-slot", "weights-wrong-shape", "weights-nan", "weights-negative",
         "weights-not-summing-to-one"],
)
def test_routing_table_refuses_a_malformed_layer(phy2log, slots, weights, match):
    with pytest.raises(PlacementFormatError, match=match):
        LayerRoutingTable.build(phy2log, slots, 3, weights_P=weights)


@pytest.mark.parametrize("check_values", [True, False], ids=["checked", "vouched"])
@pytest.mark.parametrize(
    "counts, match",
    [
        (torch.tensor([1.0, 2.0, 3.0]), "integer torch tensor.*got dtype torch.float32"),
        (torch.tensor([True, False, True]), "integer torch tensor.*got dtype torch.bool"),
        (np.array([1, 2, 3]), "integer torch tensor of tokens per expert; got ndarray"),
        (torch.tensor([1, 2]), r"shape \[3\]"),
        (torch.tensor([[1, 2, 3]]), r"shape \[3\]"),
    ],
    ids=["float", "bool", "numpy", "too-few-experts", "2d"],
)
def test_router_refuses_counts_of_the_wrong_dtype_or_shape_even_when_vouched_for(counts, match, check_values):
    table = LayerRoutingTable.build(np.array([0, 1, 0, 2]), 2, 3)
    with pytest.raises(ValueError, match=match):
        route_step(counts, table, check_values=check_values)


def test_router_refuses_negative_counts():
    table = LayerRoutingTable.build(np.array([0, 1, 0, 2]), 2, 3)
    with pytest.raises(ValueError, match="counts_E must be >= 0; found -2"):
        route_step(torch.tensor([1, -2, 3]), table)
