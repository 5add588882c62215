"""Fixtures of the adapter tests."""

import pytest
import torch


def _expert_loads(kind: str, generator: torch.Generator, layers: int, experts: int) -> torch.Tensor:
    """[layers, experts] loads of a kind: "ties" (few distinct integers: many equal items in every sort),
    "lognormal" (rounded) or "normalised" (float64 fractions summing to 1 per layer)."""
    if kind == "ties":
        return torch.randint(0, 6, (layers, experts), generator=generator)
    if kind == "lognormal":
        return torch.empty(layers, experts).log_normal_(3.0, 1.0, generator=generator).round()
    weight = torch.rand(layers, experts, generator=generator, dtype=torch.float64) ** 3
    return weight / weight.sum(-1, keepdim=True)


@pytest.fixture
def expert_loads():
    """`(kind, generator, layers, experts) -> [layers, experts]` random expert loads (see `_expert_loads`)."""
    return _expert_loads
