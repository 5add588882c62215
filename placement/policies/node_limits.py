"""Node limits of the `cpsat` policy: each expert group's replicas within `nodes_per_group` nodes.

Legend: E logical experts, G GPUs, S slots per GPU, P = G * S slots, N nodes, Q expert groups (consecutive experts),
T window steps.

DeepSeek's models route a token to experts of a few groups only, and its hierarchical policy keeps every group on
one node so that a token's experts sit on few nodes (traffic stays on NVLink). The `cpsat` policy honours the same
rule from the same start: the hierarchical greedy (`place_deepseek` with the groups; it needs a multiple of the nodes
as groups, as DeepSeek's does) places every group on one node, and every other candidate keeps each group on the
nodes the greedy gave it (chain layouts and swaps inside each node), or, in CP-SAT's model, within `nodes_per_group`
nodes starting there. So a feasible placement always exists, the fit's choice among feasible candidates is never
worse than the greedy on the window, and no candidate breaks the rule.
"""

from dataclasses import dataclass

import numpy as np

from placement.cluster import ClusterSpec
from placement.errors import PlacementInfeasibleError
from placement.policies.chain_layout import chain_layout


@dataclass(frozen=True)
class NodeLimits:
    """The rule and where the greedy put each group.

    Attributes:
        group_of_E: [E] int, each expert's group.
        node_of_G: [G] int, each GPU's node.
        nodes_per_group: most nodes one group's replicas may span.
    """

    group_of_E: np.ndarray
    node_of_G: np.ndarray
    nodes_per_group: int

    def home_nodes(self, phy2log_P: np.ndarray, slots_per_gpu: int) -> np.ndarray:
        """[Q] the node of each group in `phy2log_P` (the hierarchical greedy's: one node a group)."""
        node_of_slot = self.node_of_G[np.arange(len(phy2log_P)) // slots_per_gpu]
        home = np.zeros(int(self.group_of_E.max()) + 1, dtype=np.int64)
        home[self.group_of_E[phy2log_P]] = node_of_slot
        return home

    def holds(self, phy2log_P: np.ndarray, slots_per_gpu: int) -> bool:
        """Whether every group's replicas lie within `nodes_per_group` nodes."""
        node_of_slot = self.node_of_G[np.arange(len(phy2log_P)) // slots_per_gpu]
        pairs = np.unique(self.group_of_E[phy2log_P] * (int(self.node_of_G.max()) + 1) + node_of_slot)
        spans = np.bincount(pairs // (int(self.node_of_G.max()) + 1))
        return bool(spans.max() <= self.nodes_per_group)


def node_limits(num_experts: int, cluster: ClusterSpec, groups: int, nodes_per_group: int) -> NodeLimits:
    """The rule for `groups` groups of consecutive experts, each within `nodes_per_group` nodes of `cluster`.

    Raises:
        PlacementInfeasibleError: groups do not divide the experts, are not a multiple of the nodes (the
            hierarchical greedy's start needs whole groups a node), or nodes_per_group exceeds the nodes.
    """
    if num_experts % groups:
        raise PlacementInfeasibleError(f"groups={groups} does not divide the {num_experts} experts")
    if groups % cluster.num_nodes:
        raise PlacementInfeasibleError(
            f"groups={groups} is not a multiple of the cluster's {cluster.num_nodes} nodes: node-limited placement "
            f"starts from DeepSeek's hierarchical policy, which gives each node whole groups; use a multiple of "
            f"{cluster.num_nodes} groups, or no node limit")
    if nodes_per_group > cluster.num_nodes:
        raise PlacementInfeasibleError(
            f"nodes_per_group={nodes_per_group} exceeds the cluster's {cluster.num_nodes} node(s)")
    return NodeLimits(np.arange(num_experts) // (num_experts // groups),
                      np.arange(cluster.num_gpus) // cluster.node_size, nodes_per_group)


def node_chain_layout(greedy_P: np.ndarray, mean_E: np.ndarray, steps_TE: np.ndarray, cluster: ClusterSpec,
                      order: str, seed: int) -> np.ndarray | None:
    """[P] per node, the chain layout (`chain_layout`) of the experts and replica counts the hierarchical greedy
    `greedy_P` [P] put on that node, on that node's GPUs; None where a node's experts cannot form one (an expert with
    more replicas than the node has GPUs)."""
    per_node = cluster.node_size * cluster.slots_per_gpu
    result = np.empty_like(greedy_P)
    for first in range(0, len(greedy_P), per_node):
        experts, replicas = np.unique(greedy_P[first:first + per_node], return_counts=True)
        if replicas.max() > cluster.node_size:
            return None
        local = chain_layout(mean_E[experts], replicas, cluster.node_size, cluster.slots_per_gpu, order, seed,
                             steps_TE[:, experts])
        result[first:first + per_node] = experts[local]
    return result
