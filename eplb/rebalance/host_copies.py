"""Host copies: the experts a rank keeps in host memory, beyond the ones its slots serve, so that its peers may die.

Legend: G ranks (one GPU each), S slots per rank.

Under a placement, every expert has a copy, in a slot or in host memory, on `failures_tolerated` + 1 ranks
(`move_plan.backup_wanted` says which rank keeps which host copy), so that any `failures_tolerated` ranks may die at
once and a survivor still holds every expert. The copies are built at start (`build`)
and replaced at each switch or recovery with the ones the new placement wants.
"""

from collectives import Communicator
from eplb.live.experts import ExpertWeights
from eplb.rebalance.move_plan import Fill, backup_wanted, holders_of, plan_fills
from eplb.rebalance.stats import RebalanceStats
from eplb.rebalance.transfer import Staging, WeightMover, stacks, tag_base
from placement import Placement


class HostCopies:
    """This rank's host copies, per layer: expert -> its weights (a stack of one) in host memory.

    Args:
        num_layers: the MoE layers of the placement.
        comm: the group's communicator (this rank is `comm.rank`, which changes when the group re-forms).
        failures_tolerated: ranks that may die at once.
    """

    def __init__(self, num_layers: int, comm: Communicator, failures_tolerated: int) -> None:
        self.comm, self.failures_tolerated = comm, failures_tolerated
        self.copies_L: list[dict[int, ExpertWeights]] = [{} for _ in range(num_layers)]

    def copy_of(self, layer: int, expert: int) -> ExpertWeights:
        """This rank's host copy of `expert` of `layer` (KeyError: none here)."""
        return self.copies_L[layer][expert]

    def wanted(self, placement: Placement, layer: int) -> list[int]:
        """The experts of `layer` this rank keeps host copies of under `placement` (`backup_wanted`), sorted."""
        experts_GS = placement.phy2log_LP[layer].reshape(placement.cluster.num_gpus, placement.cluster.slots_per_gpu)
        return [expert for rank, expert in backup_wanted(experts_GS, self.failures_tolerated) if rank == self.comm.rank]

    def start_fills(self, placement: Placement) -> list[Fill]:
        """The fills that build every rank's host copies for `placement` from the slots (at start, collective)."""
        shape = (placement.cluster.num_gpus, placement.cluster.slots_per_gpu)
        fills, sends = [], {}
        for layer in range(placement.num_layers):
            experts_GS = placement.phy2log_LP[layer].reshape(shape)
            wanted = [(gpu, "backup", expert, expert)
                      for gpu, expert in backup_wanted(experts_GS, self.failures_tolerated)]
            fills += plan_fills(layer, wanted, holders_of(experts_GS, None), sends)
        return fills

    def build(self, placement: Placement, mover: WeightMover, budget: int, stats: RebalanceStats) -> None:
        """Build every rank's host copies for `placement` from the slots (collective, at start, in rounds of at most
        `budget` bytes a rank); the bytes this rank received go to `stats.backup_bytes_at_start`."""
        fills = self.start_fills(placement)
        staging = mover.staging_for(fills)
        mover.run_all(fills, staging, budget, tag_base(0, 0), stats)
        stats.backup_bytes_at_start, stats.bytes_received = stats.bytes_received, 0
        for (_, layer, expert), weights in staging.items():
            self.copies_L[layer][expert] = weights

    def keep(self, layer: int, experts: list[int], staging: Staging) -> None:
        """Keep host copies of exactly `experts` of `layer`: staged ones, else the ones kept already."""
        self.copies_L[layer] = {expert: staging.get(("backup", layer, expert)) or self.copies_L[layer][expert]
                                for expert in experts}

    @property
    def nbytes(self) -> int:
        """Bytes of expert weights kept in host memory."""
        return sum(stack.nbytes for copies in self.copies_L for weights in copies.values() for stack in stacks(weights))
