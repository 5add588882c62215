"""The load recorder: tokens per logical expert per decode step and layer, in a ring buffer on the tokens' device.

Legend: T steps (the buffer keeps `window` finished steps and the current one), L MoE layers, E logical experts,
N tokens of this rank in a step, K top-k.

Each MoE layer counts its own tokens' top-k picks into the current step's row of the buffer; `next_step()` moves to
the next row at the end of a decode step. Nothing synchronises with the host on this path: the current row is a
0-d device tensor, updates are fixed-shape `index_add_`s, so the per-step functions compile with
`torch.compile(fullgraph=True)` and CUDA graphs can capture them. A recorder of `scope="rank"` (the default) counts
this rank's tokens, and the rebalancer all-reduces its window over the EP group when it fits; one of
`scope="group"` counts the whole group's tokens, which every layer all-gathers anyway for its routing, so every
rank holds the group's window and a rebalance starts without a collective. `save_sglang_dump` writes what
`eplb place` reads.
"""

import os
from typing import Literal

import torch

from traces.atomic_file import write_atomically


def count_picks_E(topk_ids_NK: torch.Tensor, num_experts: int) -> torch.Tensor:
    """[E] int64: how many of the N x K picks went to each expert; ids < 0 (padding) are not counted.

    Fixed shape and no host synchronisation (unlike `torch.bincount`, whose length depends on the data).
    """
    ids = topk_ids_NK.reshape(-1).to(torch.int64)
    valid = (ids >= 0).to(torch.int64)
    counts = torch.zeros(num_experts, dtype=torch.int64, device=ids.device)
    return counts.index_add_(0, ids.clamp_min(0), valid)


def add_to_row_(buffer_TE: torch.Tensor, row: torch.Tensor, counts_E: torch.Tensor) -> None:
    """buffer_TE[row] += counts_E, with `row` a 0-d or [1] int64 device tensor (no host synchronisation)."""
    buffer_TE.index_add_(0, row.reshape(1), counts_E.reshape(1, -1))


class LoadRecorder:
    """Per-step expert loads of one rank's tokens (`scope="rank"`) or of the group's (`scope="group"`), the last
    `window` steps.

    Attributes:
        buffer_TLE: [window + 1, L, E] int64 on `device`: the `window` finished steps and the current one, in ring
            order.
        position: 0-d int64 device tensor, the row the current step writes.
        steps_recorded: decode steps finished so far (host-side counter, advanced by `next_step`).
        scope: "rank" or "group": whose tokens the MoE layers count into it.
        token_counts_V: with `vocab_size`, [V] int64 on `device`: how often each token id reached a hash-routed
            layer of this rank since the start (counted once per step, by the first hash layer that reports), the
            token-count table a hash layer's placement is fitted from (`placement.hash_routing`); else None.
    """

    def __init__(self, window: int, num_layers: int, num_experts: int, device: torch.device | str = "cpu",
                 scope: Literal["rank", "group"] = "rank", vocab_size: int | None = None) -> None:
        for name, value in (("window", window), ("num_layers", num_layers), ("num_experts", num_experts),
                            ("vocab_size", 1 if vocab_size is None else vocab_size)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer; got {value!r}")
        if scope not in ("rank", "group"):
            raise ValueError(f"scope must be 'rank' or 'group'; got {scope!r}")
        self.window, self.num_layers, self.num_experts, self.scope = window, num_layers, num_experts, scope
        self.buffer_TLE = torch.zeros(window + 1, num_layers, num_experts, dtype=torch.int64, device=device)
        self.position = torch.zeros((), dtype=torch.int64, device=device)
        self.steps_recorded = 0
        self.token_counts_V = None if vocab_size is None else torch.zeros(vocab_size, dtype=torch.int64, device=device)
        self._token_layer: int | None = None

    def record(self, layer: int, topk_ids_NK: torch.Tensor) -> None:
        """Add this step's picks of one layer ([N, K] expert ids, -1 for padding) to the current row."""
        self.record_counts(layer, count_picks_E(topk_ids_NK, self.num_experts))

    def record_counts(self, layer: int, counts_E: torch.Tensor) -> None:
        """Add this step's tokens per expert of one layer ([E] int64, as `count_picks_E` gives, for a caller that
        counts them anyway; the group's total with `scope="group"`) to the current row."""
        add_to_row_(self.buffer_TLE[:, layer], self.position, counts_E)

    def record_token_ids(self, layer: int, token_ids: torch.Tensor) -> None:
        """Count a hash layer's token ids (any shape, int64 below `vocab_size`) into `token_counts_V`; only the first
        layer that reports counts, so that every token counts once however many hash layers there are. No-op
        without `vocab_size`."""
        if self.token_counts_V is None:
            return
        if self._token_layer is None:
            self._token_layer = layer
        if layer == self._token_layer:
            ids = token_ids.reshape(-1).to(device=self.token_counts_V.device, dtype=torch.int64)
            self.token_counts_V.index_add_(0, ids, torch.ones_like(ids))

    def next_step(self) -> None:
        """End the current decode step: the next row is cleared and becomes current."""
        self.position.add_(1).remainder_(self.window + 1)
        self.buffer_TLE.index_fill_(0, self.position.reshape(1), 0)
        self.steps_recorded += 1

    def discard_current_step(self) -> None:
        """Clear the current step's row (a step that is recomputed after a failure records once)."""
        self.buffer_TLE.index_fill_(0, self.position.reshape(1), 0)

    def window_load_LE(self) -> torch.Tensor:
        """[L, E] int64: tokens per expert summed over the finished steps still in the window."""
        return self.counts_TLE().sum(0)

    def counts_TLE(self, last: int | None = None) -> torch.Tensor:
        """[T, L, E] int64: the finished steps still in the window, oldest first (T = min(steps, window)); with
        `last`, only the last that many of them."""
        kept = min(self.steps_recorded, self.window, self.window if last is None else last)
        rows = self.window + 1
        start = (int(self.position) - kept) % rows  # one host read, off the per-step path
        order = (torch.arange(kept, device=self.buffer_TLE.device) + start) % rows
        return self.buffer_TLE.index_select(0, order)

    def save_sglang_dump(self, path: str | os.PathLike) -> None:
        """Write `{"logical_count": [T, L, E]}` as a torch file, the SGLang expert-distribution dump `eplb` reads."""
        counts = self.counts_TLE().cpu()
        write_atomically(path, lambda tmp: torch.save({"logical_count": counts}, tmp))
