"""One rank of an EP group generating with a transformers MoE model: its share of the sequences, optionally with a
`Rebalancer` (a rebalance started mid-generation, weights moved, a switch between two forwards) and a rank killed
mid-forward (the survivors regroup and re-prefill the lost sequences). What `scripts/hf_demo.py` runs.

Legend: B sequences, N new tokens, F forwards of the group (counted across recoveries), L MoE layers, W ranks.

Every rank streams each token it generates to the rendezvous store (key `tokens_key(sequence)`), as a serving
engine streams tokens to its frontend, and records after each forward the rows its MoE layers computed
(`forward_key`). When a rank dies, its peers' collectives fail; the survivors recover (`Rebalancer.recover`: agree,
regroup, restore the lost experts from host copies), take over the lost rank's sequences (round robin over the
survivors), and re-prefill every sequence they serve from its prompt and the tokens streamed so far: a forward cut
short by the failure has already written the cut token into the KV cache of the layers before the failure, so the
cache is rebuilt rather than trusted. Greedy decoding then continues to N tokens.
"""

import json
import os
import signal
from dataclasses import dataclass, field

import torch

from collectives import CollectiveError, Communicator
from eplb.engines.transformers.models import expert_parallel
from eplb.engines.transformers.generation import build_model, rank_rows
from eplb.live.load_recorder import LoadRecorder
from eplb.rebalance.config import RebalanceConfig
from eplb.rebalance.rebalancer import Rebalancer
from placement import Placement


def tokens_key(sequence: int) -> str:
    """The store key of a sequence's streamed tokens (a JSON list of ids)."""
    return f"eplb/hf/tokens/{sequence}"


def forward_key(forward: int, original_rank: int) -> str:
    """The store key of what a rank's MoE layers did in a forward (JSON: `computed_L`, `picks_L`)."""
    return f"eplb/hf/forward/{forward}/{original_rank}"


@dataclass(frozen=True)
class GenerationJob:
    """What every rank needs: the model (arch, config, seed), the prompts [B][S], the placement, and optionally a
    rebalancer's settings, the token at which a rebalance starts, and a rank to kill at a token (original ranks;
    token t is the one the model's t-th forward of a sequence picks, counted from 0)."""

    arch: str
    config: dict
    seed: int
    prompt: list[list[int]]
    new_tokens: int
    placement: Placement
    routing: str = "dynamic"
    rebalance: RebalanceConfig | None = None
    rebalance_at: int | None = None
    fail_rank: int | None = None
    fail_at_token: int | None = None


@dataclass
class RankGeneration:
    """What one rank generated and did.

    Attributes:
        tokens: the sequences this rank finished: sequence -> its N tokens.
        logits: (sequence, token index) -> the logits [vocab] float32 this rank picked that token from.
        layers_swapped: the decoder layers whose MoE block was replaced.
        requeued: sequences this rank took over from lost ranks.
        recoveries: the rebalancer's recovery reports.
        stats: the rebalancer's `RebalanceStats` fields ({} without one).
        forwards: on the last group's rank 0, every forward record of every rank the store holds:
            (forward, original rank) -> {"computed_L", "picks_L"}; {} elsewhere.
    """

    tokens: dict[int, list[int]] = field(default_factory=dict)
    logits: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict)
    layers_swapped: list[int] = field(default_factory=list)
    requeued: list[int] = field(default_factory=list)
    recoveries: list[dict] = field(default_factory=list)
    stats: dict = field(default_factory=dict)
    forwards: dict[tuple[int, int], dict] = field(default_factory=dict)


@dataclass
class _State:
    """The rank's position: the group's forward counter, the sequences served now and their tokens so far."""

    world_size: int = 0  # of the group as first formed
    forward: int = 0
    next_token: int = 0  # the index of the token the next forward picks
    serving: list[int] = field(default_factory=list)
    owner: dict[int, int] = field(default_factory=dict)  # sequence -> original rank serving it
    tokens: dict[int, list[int]] = field(default_factory=dict)
    rebalance_requested: bool = False
    doomed: bool = False


def serve_on_rank(comm: Communicator, job: GenerationJob) -> RankGeneration:
    """Build the model, replace its MoE blocks by the placement's EP layers, and generate this rank's sequences
    (and those it takes over from a lost rank) to `job.new_tokens` tokens each."""
    torch.set_num_threads(1)
    model = build_model(job.arch, job.config, job.seed)
    recorder = None
    if job.rebalance is not None:
        recorder = LoadRecorder(job.rebalance.window, job.placement.num_layers, job.placement.num_experts,
                                comm.device, scope="group")
    swapped = expert_parallel(model, comm, job.placement, routing=job.routing, recorder=recorder)
    layers = [model.model.layers[index].mlp for index in swapped]
    rebalancer = None if recorder is None else Rebalancer(job.rebalance, comm, layers, recorder, job.placement)
    result = RankGeneration(layers_swapped=swapped)
    state = _State(world_size=comm.world_size)
    for original in range(comm.world_size):
        rows = rank_rows(len(job.prompt), comm.world_size, original)
        state.owner.update({sequence: original for sequence in range(rows.start, rows.stop)})
    state.serving = [sequence for sequence, owner in state.owner.items() if owner == comm.original_rank]
    state.tokens = {sequence: [] for sequence in state.serving}
    _install_hooks(model, layers, comm, job, state, result, rebalancer, recorder)
    try:
        while True:
            start = min(len(state.tokens[sequence]) for sequence in state.serving)
            if start >= job.new_tokens:
                break
            try:
                _generate(model, job, state, start)
            except CollectiveError:
                if rebalancer is None:
                    raise
                _take_over(comm, state, result, rebalancer)
    finally:
        if rebalancer is not None:
            rebalancer.close()
    result.tokens = {sequence: state.tokens[sequence][: job.new_tokens] for sequence in state.serving}
    if rebalancer is not None:
        result.stats = vars(rebalancer.stats)
    comm.barrier()  # every rank has stored its last forward's record
    if comm.rank == 0:
        result.forwards = _forward_records(comm, state.forward, state.world_size)
    return result


def _generate(model, job: GenerationJob, state: _State, start: int) -> None:
    """Greedy generation of the sequences served, from their prompt and first `start` tokens, to N tokens (no stop
    on EOS, so that every rank runs the same forwards); the hooks stream and record each token.

    Raises:
        RuntimeError: generate picked another token than the logits' argmax (a logits processor is active).
    """
    for sequence in state.serving:
        del state.tokens[sequence][start:]
    state.next_token = start
    inputs = torch.tensor([job.prompt[sequence] + state.tokens[sequence] for sequence in state.serving],
                          dtype=torch.int64)
    with torch.no_grad():
        out = model.generate(inputs, attention_mask=torch.ones_like(inputs), max_new_tokens=job.new_tokens - start,
                             do_sample=False, eos_token_id=None)
    picked = out[:, inputs.shape[1]:].tolist()
    if picked != [state.tokens[sequence][start:] for sequence in state.serving]:
        raise RuntimeError("generate picked tokens other than the argmax of the logits: greedy decoding must run "
                           "without logits processors")


def _install_hooks(model, layers: list, comm: Communicator, job: GenerationJob, state: _State,
                   result: RankGeneration, rebalancer: Rebalancer | None, recorder: LoadRecorder | None) -> None:
    """Before each forward: the rebalancer's step (a requested rebalance at `rebalance_at`, rank 0 waiting for its
    solve) and the doomed rank's fate; before the last MoE layer: the kill; after the last MoE layer: the forward's
    record in the store; after the forward: each sequence's token streamed and its logits kept."""

    def before_forward(module, args, kwargs):
        forward = state.forward
        state.forward += 1  # counted when started, so that every survivor of a failed forward counts it
        if rebalancer is not None:
            if state.next_token == job.rebalance_at and not state.rebalance_requested:
                rebalancer.request_rebalance()
                state.rebalance_requested = True
            rebalancer.step(forward)
            rebalancer.wait_for_solve()
        state.doomed = comm.original_rank == job.fail_rank and state.next_token == job.fail_at_token

    def before_last_layer(module, args, kwargs):
        if state.doomed:  # the earlier layers of this forward ran on every rank: their KV caches hold its token
            _die_in_next_all_to_all(comm)

    def after_last_layer(module, args, output):
        record = {"computed_L": [int(layer.last_step["computed_S"].sum()) for layer in layers],
                  "picks_L": [int(layer.last_step["quota_P"].sum()) for layer in layers]}
        comm.store.set(forward_key(state.forward - 1, comm.original_rank), json.dumps(record))
        if recorder is not None:
            recorder.next_step()

    def after_forward(module, args, kwargs, output):
        logits_BV = output.logits[:, -1].detach().float()
        for row, sequence in enumerate(state.serving):
            state.tokens[sequence].append(int(logits_BV[row].argmax()))
            result.logits[(sequence, state.next_token)] = logits_BV[row].clone()
            comm.store.set(tokens_key(sequence), json.dumps(state.tokens[sequence]))
        state.next_token += 1

    model.register_forward_pre_hook(before_forward, with_kwargs=True)
    layers[-1].register_forward_pre_hook(before_last_layer, with_kwargs=True)
    layers[-1].register_forward_hook(after_last_layer)
    model.register_forward_hook(after_forward, with_kwargs=True)


def _die_in_next_all_to_all(comm: Communicator) -> None:
    """Kill this rank's process outright (SIGKILL) as it enters its next all-to-all (the layer's dispatch), where
    every peer waits on it directly and so sees the failure at once (in a ring all-gather, a peer two hops away
    would wait for the communicator's timeout)."""
    def dying(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGKILL)

    comm.all_to_all = dying


def _take_over(comm: Communicator, state: _State, result: RankGeneration, rebalancer: Rebalancer) -> None:
    """After a `CollectiveError`: recover the group, take over (round robin over the survivors, the same on each)
    the lost ranks' sequences with the tokens they streamed, and cut every sequence served to the shortest."""
    recovery = rebalancer.recover(state.forward)
    result.recoveries.append(recovery.as_dict())
    survivors = sorted(comm.members)
    lost = sorted(sequence for sequence, owner in state.owner.items() if owner not in survivors)
    for index, sequence in enumerate(lost):
        state.owner[sequence] = survivors[index % len(survivors)]
        if state.owner[sequence] == comm.original_rank:
            key = tokens_key(sequence)
            state.tokens[sequence] = json.loads(comm.store.get(key)) if comm.store.check([key]) else []
            result.requeued.append(sequence)
    state.serving = sorted(sequence for sequence, owner in state.owner.items() if owner == comm.original_rank)
    shortest = min(len(state.tokens[sequence]) for sequence in state.serving)
    for sequence in state.serving:
        del state.tokens[sequence][shortest:]


def _forward_records(comm: Communicator, forwards: int, world_size: int) -> dict[tuple[int, int], dict]:
    """Every (forward, original rank) record in the store, the lost ranks' included."""
    records = {}
    for forward in range(forwards):
        for rank in range(world_size):
            key = forward_key(forward, rank)
            if comm.store.check([key]):
                records[(forward, rank)] = json.loads(comm.store.get(key))
    return records
