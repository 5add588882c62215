"""SwiGLU experts: the weights of every logical expert, the slices a rank holds, and the batched compute.

Legend: A a stack of experts (the E experts of a layer, the S slots of this rank, or a staging buffer), D hidden size,
F expert inner size, R rows (token picks).
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class ExpertWeights:
    """SwiGLU weights stacked over experts (or over one rank's slots): y = (silu(x W_gate) * (x W_up)) W_down.

    Attributes:
        gate_ADF: [A, D, F] float, A experts or slots.
        up_ADF: [A, D, F] float.
        down_AFD: [A, F, D] float.
    """

    gate_ADF: torch.Tensor
    up_ADF: torch.Tensor
    down_AFD: torch.Tensor

    @classmethod
    def random(cls, count: int, hidden: int, inner: int, seed: int, dtype=torch.float32) -> "ExpertWeights":
        """Seeded random weights (scaled so activations stay O(1)), for tests, demos and benchmarks."""
        generator = torch.Generator().manual_seed(seed)

        def draw(*shape, fan_in):
            return (torch.randn(*shape, generator=generator) / fan_in**0.5).to(dtype)

        return cls(draw(count, hidden, inner, fan_in=hidden), draw(count, hidden, inner, fan_in=hidden),
                   draw(count, inner, hidden, fan_in=inner))

    @classmethod
    def empty(cls, count: int, hidden: int, inner: int, dtype=torch.float32, device="cpu") -> "ExpertWeights":
        """Uninitialised weights of `count` experts (buffers a transfer fills)."""
        return cls(torch.empty(count, hidden, inner, dtype=dtype, device=device),
                   torch.empty(count, hidden, inner, dtype=dtype, device=device),
                   torch.empty(count, inner, hidden, dtype=dtype, device=device))

    def select(self, index_A: torch.Tensor) -> "ExpertWeights":
        """The weights of experts `index_A` [A'] (e.g. the experts a rank's slots hold), as a new stack."""
        return ExpertWeights(self.gate_ADF[index_A], self.up_ADF[index_A], self.down_AFD[index_A])

    def to(self, device: torch.device | str) -> "ExpertWeights":
        return ExpertWeights(self.gate_ADF.to(device), self.up_ADF.to(device), self.down_AFD.to(device))


def swiglu(x_RD: torch.Tensor, gate_DF: torch.Tensor, up_DF: torch.Tensor, down_FD: torch.Tensor,
           limit: float | None = None) -> torch.Tensor:
    """[R, D]: one expert's output for each row; with `limit` (DeepSeek-V4's swiglu_limit), the gate projection is
    clamped to at most `limit` and the up projection to [-limit, limit] before they meet."""
    gate, up = x_RD @ gate_DF, x_RD @ up_DF
    if limit is not None:
        gate, up = gate.clamp(max=limit), up.clamp(min=-limit, max=limit)
    return (F.silu(gate) * up) @ down_FD


def grouped_swiglu(x_RD: torch.Tensor, group_sizes: list[int], weights: ExpertWeights,
                   limit: float | None = None) -> torch.Tensor:
    """[R, D]: rows grouped by slot (group a holds the next group_sizes[a] rows), each group through its expert
    (clamped by `limit` as in `swiglu`)."""
    out = torch.empty_like(x_RD)
    start = 0
    for slot, size in enumerate(group_sizes):
        if size:
            rows = slice(start, start + size)
            out[rows] = swiglu(x_RD[rows], weights.gate_ADF[slot], weights.up_ADF[slot], weights.down_AFD[slot],
                               limit)
        start += size
    return out
