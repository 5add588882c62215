"""Migration plans: fewest copies, the target's balance kept exactly, and moves that rebuild the realised placement."""

import itertools
from collections import Counter

import numpy as np
import pytest
import torch

from placement import ClusterSpec, Placement, PlacementFormatError
from placement.migration import oblivious_moves, plan_migration, realise_in_place
from placement.policies.chain_layout import chain_layout
from placement.policies.deepseek import replicate_greedy
from placement.routing.live_router import LayerRoutingTable, route_step

# (num_gpus, slots_per_gpu, gpus_per_node, num_layers, num_experts)
SHAPES = [(16, 3, 4, 3, 40), (8, 5, 8, 2, 30), (12, 2, 4, 4, 20), (4, 2, 8, 2, 5)]
SHAPE_IDS = ["16x3-4pernode", "8x5-1node", "12x2-3nodes", "4x2-small-node"]


def random_placement(rng, shape, equal_split: bool = True) -> Placement:
    """Every expert at least one replica, exactly S slots per GPU; random weights unless `equal_split`."""
    num_gpus, slots, per_node, num_layers, num_experts = shape
    cluster = ClusterSpec(num_gpus=num_gpus, slots_per_gpu=slots, gpus_per_node=per_node)
    extra = cluster.num_slots - num_experts
    rows = [
        rng.permutation(np.r_[np.arange(num_experts), rng.integers(0, num_experts, extra)]) for _ in range(num_layers)
    ]
    placement = Placement.equal_split(np.array(rows), cluster, num_experts)
    if equal_split:
        return placement
    phy2log = placement.phy2log_LP
    raw = rng.uniform(0.1, 1.0, size=phy2log.shape)
    sums = np.zeros((num_layers, num_experts))
    np.add.at(sums, (np.arange(num_layers)[:, None], phy2log), raw)
    return Placement(phy2log, raw / np.take_along_axis(sums, phy2log, axis=1), cluster, num_experts)


def reshuffled(rng, placement: Placement, gpu_order_G: np.ndarray, shuffle_slots: bool) -> Placement:
    """The same placement with new GPU i holding old GPU gpu_order_G[i]'s slots, optionally shuffled per GPU."""
    num_layers, cluster = placement.num_layers, placement.cluster
    shape = (num_layers, cluster.num_gpus, cluster.slots_per_gpu)
    experts = placement.phy2log_LP.reshape(shape)[:, gpu_order_G]
    weights = placement.weights_LP.reshape(shape)[:, gpu_order_G]
    if shuffle_slots:
        order = np.argsort(rng.random(shape), axis=-1)
        experts, weights = np.take_along_axis(experts, order, -1), np.take_along_axis(weights, order, -1)
    return Placement(experts.reshape(num_layers, -1), weights.reshape(num_layers, -1), cluster, placement.num_experts)


def moves_for_map(current: Placement, target: Placement, gpu_map_G) -> int:
    """Independent oracle: sum over (layer, target GPU j) of S - |target j's experts ∩ current gpu_map[j]'s|."""
    slots = current.cluster.slots_per_gpu
    total = 0
    for layer in range(current.num_layers):
        for j, i in enumerate(gpu_map_G):
            wanted = Counter(target.phy2log_LP[layer, j * slots : (j + 1) * slots].tolist())
            held = Counter(current.phy2log_LP[layer, i * slots : (i + 1) * slots].tolist())
            total += slots - sum((wanted & held).values())
    return total


def node_preserving_maps(num_gpus: int, node_size: int, permute_nodes: bool):
    """Every GPU map a plan may choose: GPUs permuted inside nodes, and whole nodes permuted if allowed."""
    num_nodes = max(1, num_gpus // node_size)
    node_size = min(node_size, num_gpus)
    node_maps = itertools.permutations(range(num_nodes)) if permute_nodes else [tuple(range(num_nodes))]
    for node_map in node_maps:
        for inner in itertools.product(itertools.permutations(range(node_size)), repeat=num_nodes):
            yield [node_map[m] * node_size + inner[m][k] for m in range(num_nodes) for k in range(node_size)]


def within_node_order(rng, cluster: ClusterSpec) -> np.ndarray:
    size = cluster.node_size
    return np.concatenate([rng.permutation(np.arange(n * size, (n + 1) * size)) for n in range(cluster.num_nodes)])


@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_unchanged_placement_moves_nothing_and_keeps_every_slot(shape):
    current = random_placement(np.random.default_rng(0), shape, equal_split=False)
    plan = plan_migration(current, current, bytes_per_expert=1000)
    assert plan.num_moves == 0 and plan.bytes_moved == 0 and plan.moves.shape == (0, 4)
    np.testing.assert_array_equal(plan.gpu_map_G, np.arange(current.cluster.num_gpus))
    np.testing.assert_array_equal(plan.realised.phy2log_LP, current.phy2log_LP)
    np.testing.assert_array_equal(plan.realised.weights_LP, current.weights_LP)
    assert plan.summary()["layers_touched"] == 0


@pytest.mark.parametrize("relabel", ["gpus-within-node", "slots-within-gpu", "both", "whole-nodes-and-both"])
@pytest.mark.parametrize("shape", SHAPES[:3], ids=SHAPE_IDS[:3])
def test_relabelled_target_moves_nothing(shape, relabel):
    rng = np.random.default_rng(1)
    current = random_placement(rng, shape, equal_split=False)
    cluster = current.cluster
    gpu_order = np.arange(cluster.num_gpus)
    if relabel in ("gpus-within-node", "both", "whole-nodes-and-both"):
        gpu_order = within_node_order(rng, cluster)
    if relabel == "whole-nodes-and-both":
        node_order = np.roll(np.arange(cluster.num_nodes), 1)
        gpu_order = gpu_order.reshape(cluster.num_nodes, -1)[node_order].ravel()
    target = reshuffled(rng, current, gpu_order, shuffle_slots=relabel != "gpus-within-node")
    plan = plan_migration(current, target)
    assert plan.num_moves == 0
    np.testing.assert_array_equal(plan.realised.phy2log_LP, current.phy2log_LP)
    np.testing.assert_array_equal(plan.realised.weights_LP, current.weights_LP)



@pytest.mark.parametrize("shape", SHAPES[:3], ids=SHAPE_IDS[:3])
def test_without_relabelling_gpus_each_gpu_keeps_its_label_and_only_its_slots_are_matched(shape):
    rng = np.random.default_rng(4)
    current = random_placement(rng, shape, equal_split=False)
    cluster = current.cluster
    gpu_order = within_node_order(rng, cluster)
    target = reshuffled(rng, current, gpu_order, shuffle_slots=True)
    plan = plan_migration(current, target, relabel_gpus=False)
    np.testing.assert_array_equal(plan.gpu_map_G, np.arange(cluster.num_gpus))
    by_gpu = [np.sort(p.phy2log_LP.reshape(p.num_layers, cluster.num_gpus, -1), axis=-1) for p in (plan.realised,
                                                                                                     target)]
    np.testing.assert_array_equal(*by_gpu)  # GPU j holds target GPU j's experts
    # Slots only reshuffled inside each GPU move nothing; GPUs relabelled do, where relabelling would move none.
    assert plan.num_moves >= plan_migration(current, target).num_moves == 0
    same_gpus = reshuffled(rng, current, np.arange(cluster.num_gpus), shuffle_slots=True)
    assert plan_migration(current, same_gpus, relabel_gpus=False).num_moves == 0

def test_whole_node_swap_needs_moves_when_node_permutation_is_off():
    rng = np.random.default_rng(2)
    current = random_placement(rng, SHAPES[0])
    node_size = current.cluster.node_size
    swapped = np.r_[np.arange(node_size, 2 * node_size), np.arange(node_size), np.arange(2 * node_size, 16)]
    target = reshuffled(rng, current, swapped, shuffle_slots=False)
    assert plan_migration(current, target, permute_nodes=True).num_moves == 0
    plan = plan_migration(current, target, permute_nodes=False)
    assert plan.num_moves > 0
    np.testing.assert_array_equal(plan.gpu_map_G // node_size, np.arange(16) // node_size)


@pytest.mark.parametrize("permute_nodes", [True, False], ids=["node-swaps", "within-node"])
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_plan_never_moves_more_than_the_oblivious_remap_and_meets_its_own_bound(shape, permute_nodes):
    for seed in range(3):
        rng = np.random.default_rng(seed)
        current, target = random_placement(rng, shape), random_placement(rng, shape)
        plan = plan_migration(current, target, permute_nodes=permute_nodes)
        assert plan.num_moves <= oblivious_moves(current, target)
        # the slot assignment reaches the multiset bound for the chosen relabelling
        assert plan.num_moves == moves_for_map(current, target, plan.gpu_map_G)
        assert sorted(plan.gpu_map_G.tolist()) == list(range(current.cluster.num_gpus))
        node_size = current.cluster.node_size
        node_of_target = plan.gpu_map_G.reshape(-1, node_size) // node_size
        assert (node_of_target == node_of_target[:, :1]).all(), "a target node was split over physical nodes"


@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_realised_has_target_multisets_weights_and_static_loads_up_to_relabelling(shape):
    rng = np.random.default_rng(3)
    current, target = random_placement(rng, shape, False), random_placement(rng, shape, False)
    plan = plan_migration(current, target)
    num_layers, num_gpus, slots = target.num_layers, target.cluster.num_gpus, target.cluster.slots_per_gpu
    for layer in range(num_layers):
        for j, i in enumerate(plan.gpu_map_G.tolist()):
            wanted, held = slice(j * slots, (j + 1) * slots), slice(i * slots, (i + 1) * slots)
            want = sorted(zip(target.phy2log_LP[layer, wanted].tolist(), target.weights_LP[layer, wanted].tolist()))
            got = sorted(
                zip(plan.realised.phy2log_LP[layer, held].tolist(), plan.realised.weights_LP[layer, held].tolist())
            )
            assert got == want, f"layer {layer}: target GPU {j} realised on GPU {i} differs"
    counts_LE = rng.integers(0, 1000, size=(num_layers, target.num_experts)).astype(float)

    def static_loads_LG(placement):
        loads = placement.weights_LP * np.take_along_axis(counts_LE, placement.phy2log_LP, axis=1)
        return loads.reshape(num_layers, num_gpus, slots).sum(axis=-1)

    np.testing.assert_allclose(static_loads_LG(plan.realised)[:, plan.gpu_map_G], static_loads_LG(target))


@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_moves_come_from_current_holders_and_rebuild_the_realised_placement(shape):
    rng = np.random.default_rng(4)
    current, target = random_placement(rng, shape), random_placement(rng, shape)
    plan = plan_migration(current, target, bytes_per_expert=7)
    slots, node_size = current.cluster.slots_per_gpu, current.cluster.node_size
    rebuilt = current.phy2log_LP.copy()
    for layer, slot, expert, source in plan.moves.tolist():
        holders = current.phy2log_LP[layer].reshape(-1, slots)
        assert expert in holders[source], f"GPU {source} does not hold expert {expert} in layer {layer}"
        assert current.phy2log_LP[layer, slot] != expert, "a move copies an expert its slot already holds"
        holder_nodes = np.flatnonzero((holders == expert).any(axis=1)) // node_size
        if (holder_nodes == slot // slots // node_size).any():
            assert source // node_size == slot // slots // node_size, "an on-node source was passed over"
        rebuilt[layer, slot] = expert
    np.testing.assert_array_equal(rebuilt, plan.realised.phy2log_LP)
    assert plan.bytes_moved == 7 * plan.num_moves
    assert plan.moves_per_layer().sum() == plan.num_moves
    assert plan.summary()["num_moves"] == plan.num_moves


def test_worked_example_of_the_module_docstring():
    cluster = ClusterSpec(num_gpus=2, slots_per_gpu=2)
    current = Placement.equal_split(np.array([[0, 1, 2, 0]]), cluster, 3)
    target = Placement.equal_split(np.array([[2, 1, 0, 1]]), cluster, 3)
    plan = plan_migration(current, target)
    assert oblivious_moves(current, target) == 3
    assert plan.moves.tolist() == [[0, 3, 1, 0]]
    assert plan.realised.phy2log_LP.tolist() == [[0, 1, 2, 1]]
    assert plan.gpu_map_G.tolist() == [1, 0]


def test_sources_prefer_the_destination_node_then_spread_sends():
    # 2 nodes x 2 GPUs x 2 slots; expert 0 sits on GPU 0 (node 0) and GPU 2 (node 1); GPU 3 needs it
    cluster = ClusterSpec(num_gpus=4, slots_per_gpu=2, gpus_per_node=2)
    current = Placement.equal_split(np.array([[0, 1, 2, 3, 4, 0, 5, 6]]), cluster, 7)
    target = Placement.equal_split(np.array([[0, 1, 2, 3, 4, 5, 0, 6]]), cluster, 7)
    moves = plan_migration(current, target, permute_nodes=False).moves
    assert moves[moves[:, 2] == 0, 3].tolist() == [2]
    # 1 node of 4 GPUs; expert 0 on GPUs 0 and 1 is copied to GPUs 2 and 3: one send from each
    cluster = ClusterSpec(num_gpus=4, slots_per_gpu=2)
    current = Placement.equal_split(np.array([[0, 1, 0, 2, 3, 4, 3, 4]]), cluster, 5)
    target = Placement.equal_split(np.array([[0, 1, 0, 2, 3, 0, 0, 4]]), cluster, 5)
    plan = plan_migration(current, target)
    assert sorted(plan.moves[:, 3].tolist()) == [0, 1]
    assert plan.summary()["max_sends_per_gpu"] == 1


MISMATCHES = {
    "layers": (4, 2, 8, 3, 6),
    "experts": (4, 2, 8, 2, 7),
    "gpus": (8, 2, 8, 2, 6),
    "slots": (4, 3, 8, 2, 6),
    "gpus-per-node": (4, 2, 2, 2, 6),
}


@pytest.mark.parametrize("other", MISMATCHES.values(), ids=MISMATCHES.keys())
def test_mismatched_model_or_cluster_raises_placement_format_error(other):
    rng = np.random.default_rng(5)
    current, target = random_placement(rng, (4, 2, 8, 2, 6)), random_placement(rng, other)
    with pytest.raises(PlacementFormatError, match="cannot migrate between"):
        plan_migration(current, target)
    with pytest.raises(PlacementFormatError, match="cannot migrate between"):
        oblivious_moves(current, target)


def test_negative_bytes_per_expert_is_a_value_error():
    placement = random_placement(np.random.default_rng(6), SHAPES[3])
    with pytest.raises(ValueError, match="bytes_per_expert"):
        plan_migration(placement, placement, bytes_per_expert=-1)


BRUTE_FORCE = [  # (shape, permute_nodes)
    ((3, 2, 8, 1, 4), True),
    ((3, 2, 8, 2, 4), True),
    ((4, 2, 2, 1, 5), True),
    ((4, 2, 2, 2, 5), False),
    ((6, 1, 3, 2, 4), True),
]
BRUTE_FORCE_IDS = ["1node-3gpus-1layer", "1node-3gpus-2layers", "2nodes-node-swaps", "2nodes-within-node", "2x3-1slot"]


@pytest.mark.parametrize("shape, permute_nodes", BRUTE_FORCE, ids=BRUTE_FORCE_IDS)
def test_assignment_is_minimal_over_every_allowed_relabelling(shape, permute_nodes):
    num_gpus, _, per_node = shape[:3]
    for seed in range(8):
        rng = np.random.default_rng(seed)
        current, target = random_placement(rng, shape), random_placement(rng, shape)
        best = min(moves_for_map(current, target, m) for m in node_preserving_maps(num_gpus, per_node, permute_nodes))
        assert plan_migration(current, target, permute_nodes=permute_nodes).num_moves == best, f"seed {seed}"


def test_a_realised_chain_layout_is_still_routed_exactly():
    # The target is a `cpsat`-style chain on GPU order 0..G-1; realising it on other GPUs (inside each node) breaks
    # that order, and the live router must still find the chain and give the target's busiest GPU on every step.
    rng = np.random.default_rng(5)
    num_gpus, slots, num_experts, num_layers = 16, 5, 64, 3
    cluster = ClusterSpec(num_gpus=num_gpus, slots_per_gpu=slots, gpus_per_node=8)

    def chains(seed: int) -> Placement:
        rows = []
        for layer in range(num_layers):
            load_E = np.random.default_rng(seed * 10 + layer).gamma(1.5, 100.0, num_experts)
            _, _, replicas_E = replicate_greedy(load_E[None], num_gpus * slots)
            rows.append(chain_layout(load_E, replicas_E[0], num_gpus, slots, "random", seed))
        return Placement.equal_split(np.array(rows), cluster, num_experts)

    current, target = chains(1), chains(2)
    plan = plan_migration(current, target)
    assert plan.summary()["gpus_relabelled"] > 0
    for layer in range(num_layers):
        tables = [LayerRoutingTable.build(p.phy2log_LP[layer], slots, num_experts) for p in (target, plan.realised)]
        assert [table.method for table in tables] == ["chain", "chain"]
        for counts in rng.multinomial(64 * num_gpus, rng.dirichlet(np.full(num_experts, 0.5)), size=4):
            busiest = [route_step(torch.as_tensor(counts), table).view(num_gpus, slots).sum(1).max()
                       for table in tables]
            assert busiest[0] == busiest[1]


@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_realising_in_place_alone_gives_the_plans_placement_and_the_slots_it_keeps(shape):
    rng = np.random.default_rng(11)
    current, target = random_placement(rng, shape, equal_split=False), random_placement(rng, shape, equal_split=False)
    plan = plan_migration(current, target)
    realised, gpu_map_G, kept_LP = realise_in_place(current, target)
    np.testing.assert_array_equal(realised.phy2log_LP, plan.realised.phy2log_LP)
    np.testing.assert_array_equal(realised.weights_LP, plan.realised.weights_LP)
    np.testing.assert_array_equal(gpu_map_G, plan.gpu_map_G)
    assert sorted(zip(*np.nonzero(~kept_LP))) == sorted(map(tuple, plan.moves[:, :2].tolist()))
