"""The expert-parallel MoE decode layer: gate, replica choice inside the EP group, dispatch, expert compute, combine.

Legend: G ranks (one per GPU of the placement), N tokens of this rank, D hidden size, E experts, K top-k,
S slots on this rank, P = G x S slots, R rows received by this rank.

One forward, on every rank of the group at the same step:
1. gate: each token's top-k experts and weights (`gate_topk`); the picks are recorded if a recorder is given;
2. all-gather the per-rank counts [G, E] (the one collective besides the two all-to-alls);
3. quotas per replica from the global counts, identical on every rank (`slot_quotas_EX`: router, static or
   equal split), and each pick's slot so that the quotas are met exactly (`assign_slots_NK`);
4. dispatch: picks sorted by slot, rows sent to the rank holding the slot (variable all-to-all);
5. compute: received rows grouped by local slot, each group through its slot's SwiGLU expert;
6. combine: outputs sent back (the reverse all-to-all), weighted by the gate and summed per token, plus shared
   experts. The result equals the dense single-process layer with the same weights.
"""

import os

import torch
from torch import nn

from collectives import Communicator
from eplb.live.experts import ExpertWeights, grouped_swiglu, swiglu
from eplb.live.gate import gate_topk
from eplb.live.load_recorder import LoadRecorder, count_picks_E
from eplb.live.moe_config import MoELayerConfig
from eplb.live.replica_assignment import (ROUTING_MODES, ReplicaTables, compiled_plan_step, plan_step,
                                         slot_quotas_P)
from placement import Placement, PlacementFormatError, load_placement


class MoEDecodeLayer(nn.Module):
    """One MoE layer of a decode worker, sharded over an EP group by a placement.

    `shared_module` stands for the shared experts as one module of the host model (e.g. a transformers MLP, x [..., D]
    -> [..., D]), used instead of `shared_experts`; `tid2eid` [vocab, K] int64 is a hash layer's table (with
    `config.hash_routing`): a token's experts are `tid2eid[its token id]`, so `forward` then needs `input_ids`.

    `compile_routing` runs the per-step replica choice (router, quotas, assignment) compiled as one graph, which a
    decode worker wants (the first step of each new shape pays the compile).

    Attributes:
        last_step: what the last forward planned and did: `quota_P` [P] tokens the quotas gave each slot (the
            same on every rank), `rows_sent_GP` [G, P] rows each rank sent to each slot, `computed_S` [S] rows
            this rank's slots computed, `counts_E` [E] picks of each expert over the group.
        placement: the placement this layer serves now (`install` swaps it).
        piggyback: None, or one short int64 message (a 1-D tensor) the next forward sends along with its counts
            (the all-gather it runs anyway), to every rank; it is then cleared and what every rank sent lands in
            `piggyback_received` [G, message length]. The rebalancer's agreements travel this way, so they cost no
            collective.
    """

    def __init__(
        self,
        config: MoELayerConfig,
        placement: Placement | str | os.PathLike,
        layer: int,
        comm: Communicator,
        gate_weight_ED: torch.Tensor,
        slot_experts: ExpertWeights,
        *,
        shared_experts: ExpertWeights | None = None,
        correction_bias_E: torch.Tensor | None = None,
        routing: str = "dynamic",
        recorder: LoadRecorder | None = None,
        compile_routing: bool = False,
        shared_module: nn.Module | None = None,
        tid2eid: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        placement = placement if isinstance(placement, Placement) else load_placement(placement)
        check_placement_fits(placement, layer, config, comm.world_size)
        if routing not in ROUTING_MODES:
            raise ValueError(f"routing must be one of {ROUTING_MODES}; got {routing!r}")
        slots = placement.cluster.slots_per_gpu
        if slot_experts.gate_ADF.shape != (slots, config.hidden_size, config.intermediate_size):
            raise ValueError(
                f"slot_experts must stack this rank's {slots} slots as [{slots}, {config.hidden_size}, "
                f"{config.intermediate_size}]; got {tuple(slot_experts.gate_ADF.shape)}"
            )
        check_host_parts(config, shared_experts, shared_module, tid2eid)
        shared_count = 0 if shared_experts is None else shared_experts.gate_ADF.shape[0]
        if shared_module is None and shared_count != config.num_shared_experts:
            raise ValueError(f"shared_experts holds {shared_count} experts; config.num_shared_experts is "
                             f"{config.num_shared_experts}")
        if gate_weight_ED.shape != (config.num_experts, config.hidden_size):
            raise ValueError(f"gate_weight_ED must be [{config.num_experts}, {config.hidden_size}]; got "
                             f"{tuple(gate_weight_ED.shape)}")
        self.config, self.layer, self.comm, self.routing, self.recorder = config, layer, comm, routing, recorder
        self.gate_weight_ED = gate_weight_ED.to(comm.device)
        self.correction_bias_E = None if correction_bias_E is None else correction_bias_E.to(comm.device)
        self.slot_experts = slot_experts.to(comm.device)
        self.shared_experts = None if shared_experts is None else shared_experts.to(comm.device)
        self.shared_module = shared_module
        self.tid2eid = None if tid2eid is None else tid2eid.to(device=comm.device, dtype=torch.int64)
        self.tables = ReplicaTables.build(placement, layer, comm.device)
        self.placement = placement
        self.slots_per_gpu = slots
        self.plan_step = compiled_plan_step() if compile_routing else plan_step
        self.last_step: dict[str, torch.Tensor] = {}
        self.piggyback: torch.Tensor | None = None
        self.piggyback_received: torch.Tensor | None = None

    def install(self, placement: Placement, tables: ReplicaTables, slot_experts: ExpertWeights | None = None) -> None:
        """Serve `placement` from the next forward: its tables (`ReplicaTables.build`, made beforehand so that the
        swap itself is instant) and, when given, new slot weights (else the current ones, already updated in
        place). Called between two forwards, on every rank of the group at the same step.

        Raises:
            PlacementFormatError: the placement or the slot weights do not fit this layer and group (nothing is
                changed then).
        """
        check_placement_fits(placement, self.layer, self.config, self.comm.world_size)
        weights = self.slot_experts if slot_experts is None else slot_experts.to(self.comm.device)
        slots = placement.cluster.slots_per_gpu
        if weights.gate_ADF.shape[0] != slots or tables.slots_per_gpu != slots:
            raise PlacementFormatError(f"the placement has {slots} slots per GPU; the slot weights hold "
                                       f"{weights.gate_ADF.shape[0]} and the tables {tables.slots_per_gpu}")
        self.placement, self.tables, self.slot_experts, self.slots_per_gpu = placement, tables, weights, slots
        self.last_step = {}  # figures of the old placement

    @staticmethod
    def slots_of_rank(placement: Placement, layer: int, rank: int) -> torch.Tensor:
        """[S] int64: the logical experts this rank's slots hold at `layer` (to select its expert weights)."""
        slots = placement.cluster.slots_per_gpu
        return torch.as_tensor(placement.phy2log_LP[layer, rank * slots : (rank + 1) * slots], dtype=torch.int64)

    def forward(self, x: torch.Tensor, *, input_ids: torch.Tensor | None = None) -> torch.Tensor:
        """The layer's output for the tokens of `x` [..., D], in the shape of `x`.

        Leading dimensions are flattened into one token axis and restored on the output, as transformers' MoE blocks
        do, so that [batch, seq, D] and [N, D] both work; every token is routed independently either way.
        `input_ids` [...] int64, the tokens' ids in the layout of `x` without D: a hash layer picks experts by them
        (required there); other layers ignore them.
        """
        if x.dim() == 0:
            raise ValueError(f"x must be a tensor [..., hidden_size={self.config.hidden_size}]; got a scalar")
        chosen_NK = None
        if self.tid2eid is not None:
            if input_ids is None or input_ids.numel() * x.shape[-1] != x.numel():
                raise ValueError(f"a hash layer needs input_ids with one id per token of x {tuple(x.shape)}; got "
                                 f"{None if input_ids is None else tuple(input_ids.shape)}")
            chosen_NK = self.tid2eid[input_ids.reshape(-1).to(self.tid2eid.device)]
            if self.recorder is not None:
                self.recorder.record_token_ids(self.layer, input_ids)
        return self._forward_ND(x.reshape(-1, x.shape[-1]), chosen_NK).reshape(x.shape)

    def _forward_ND(self, x_ND: torch.Tensor, chosen_NK: torch.Tensor | None = None) -> torch.Tensor:
        config, comm, tables = self.config, self.comm, self.tables
        num_tokens, top_k = x_ND.shape[0], config.top_k
        # Step 1: gate (or the hash table's picks, weighed by the gate), count and record.
        topk_ids, topk_weights = gate_topk(x_ND @ self.gate_weight_ED.T, config, self.correction_bias_E, chosen_NK)
        counts_E = count_picks_E(topk_ids, config.num_experts)
        if self.recorder is not None and self.recorder.scope == "rank":
            self.recorder.record_counts(self.layer, counts_E)
        # Step 2-3: global counts, quotas, and each pick's slot (identical arithmetic on every rank).
        if self.piggyback is None:
            counts_GE = comm.all_gather(counts_E)
        else:
            gathered = comm.all_gather(torch.cat([counts_E, self.piggyback.to(counts_E)]))
            counts_GE, self.piggyback_received = gathered[:, : config.num_experts], gathered[:, config.num_experts :]
            self.piggyback = None
        if self.recorder is not None and self.recorder.scope == "group":
            self.recorder.record_counts(self.layer, counts_GE.sum(0))
        quota_EX, slot_NK, sent_GP = self.plan_step(topk_ids, counts_GE, comm.rank, tables, self.routing)
        sent_GP = sent_GP.cpu()  # the all-to-alls' split sizes, on the host
        sent_GGS = sent_GP.view(comm.world_size, comm.world_size, self.slots_per_gpu)
        send_counts = sent_GGS[comm.rank].sum(1).tolist()
        recv_GS = sent_GGS[:, comm.rank]
        recv_counts = recv_GS.sum(1).tolist()
        # Step 4: dispatch the picks, sorted by slot (hence by destination rank).
        order = torch.sort(slot_NK.reshape(-1), stable=True).indices
        rows = x_ND[order // top_k]
        received = comm.all_to_all(rows, send_counts, recv_counts)
        # Step 5: group the received rows by local slot (from each source they arrive sorted by slot).
        local_slot_R = torch.repeat_interleave(torch.arange(self.slots_per_gpu).repeat(comm.world_size),
                                               recv_GS.reshape(-1)).to(x_ND.device)
        by_slot = torch.sort(local_slot_R, stable=True).indices
        computed_S = recv_GS.sum(0)
        outputs = torch.empty_like(received)
        outputs[by_slot] = grouped_swiglu(received[by_slot], computed_S.tolist(), self.slot_experts,
                                          config.swiglu_limit)
        # Step 6: combine.
        returned = comm.all_to_all(outputs, recv_counts, send_counts)
        per_pick = torch.empty_like(returned)
        per_pick[order] = returned
        out = (per_pick.view(num_tokens, top_k, x_ND.shape[1]) * topk_weights[..., None].to(x_ND.dtype)).sum(1)
        shared = self.shared_experts
        if self.shared_module is not None:
            out = out + self.shared_module(x_ND)
        for index in range(0 if shared is None else config.num_shared_experts):
            out = out + swiglu(x_ND, shared.gate_ADF[index], shared.up_ADF[index], shared.down_AFD[index],
                               config.swiglu_limit)
        self.last_step = {"quota_P": slot_quotas_P(quota_EX, tables), "rows_sent_GP": sent_GP, "computed_S": computed_S,
                          "counts_E": counts_GE.sum(0)}
        return out


def check_host_parts(config: MoELayerConfig, shared_experts: ExpertWeights | None, shared_module: nn.Module | None,
                     tid2eid: torch.Tensor | None) -> None:
    """Raise `ValueError` unless the shared module and the hash table agree with `config` (and with each other)."""
    if shared_module is not None and (shared_experts is not None or config.num_shared_experts == 0):
        raise ValueError("shared_module replaces shared_experts: give one of them, with config.num_shared_experts > 0")
    if config.hash_routing != (tid2eid is not None):
        raise ValueError(f"config.hash_routing is {config.hash_routing} but tid2eid was "
                         f"{'not ' if tid2eid is None else ''}given: a hash layer needs its table, others none")
    if tid2eid is not None:
        if tid2eid.dim() != 2 or tid2eid.shape[1] != config.top_k or tid2eid.is_floating_point():
            raise ValueError(f"tid2eid must be an integer table [vocab, top_k={config.top_k}]; got "
                             f"{tuple(tid2eid.shape)} {tid2eid.dtype}")
        if tid2eid.numel() and not 0 <= int(tid2eid.min()) <= int(tid2eid.max()) < config.num_experts:
            raise ValueError(f"tid2eid holds expert ids outside [0, {config.num_experts})")


def check_placement_fits(placement: Placement, layer: int, config: MoELayerConfig, world_size: int) -> None:
    """Raise `PlacementFormatError` unless `placement` can serve `layer` of this model on a group of `world_size`."""
    problems = []
    if placement.num_experts != config.num_experts:
        problems.append(f"{placement.num_experts} experts, the model has {config.num_experts}")
    if not 0 <= layer < placement.num_layers:
        problems.append(f"{placement.num_layers} layers, no layer {layer}")
    if placement.cluster.num_gpus != world_size:
        problems.append(f"{placement.cluster.num_gpus} GPUs, the EP group has {world_size} ranks")
    if problems:
        raise PlacementFormatError(
            f"the placement does not fit this layer: it has {'; '.join(problems)}; place again for this model and "
            f"group"
        )
