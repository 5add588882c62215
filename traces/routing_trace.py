"""The routing trace: tokens per logical expert per step and layer, with a validated header.

Legend: T steps, L MoE layers, E logical experts, K top-k.
"""

import math
from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from traces.errors import TraceFormatError


class TraceHeader(BaseModel):
    """Metadata stored beside the `counts` array of a routing trace."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = Field(1, description="Version of this header's schema.")
    num_layers: int = Field(gt=0, description="L: MoE layers in the trace.")
    num_experts: int = Field(gt=0, description="E: logical experts per layer.")
    top_k: int | None = Field(None, gt=0, description="K: experts each token picks, if known.")
    tokens_per_step: int | None = Field(None, gt=0, description="Tokens in one decode step of the EP group, if known.")
    source: str = Field("", description="Where the trace came from (file, generator and seed, task).")

    @model_validator(mode="after")
    def _top_k_fits(self) -> "TraceHeader":
        if self.top_k is not None and self.top_k > self.num_experts:
            raise ValueError(f"top_k={self.top_k} exceeds num_experts={self.num_experts}")
        return self


MAX_TOTAL_TOKENS = 2**53  # the most tokens a trace may hold in all: every sum stays exact in int64 and float64
# The most counts (T x L x E) a reader builds from one file: 2 GiB as int64, 8 times the longest trace the docs use
# (2,000 steps x 61 layers x 256 experts) and 17 times SGLang's default recorder buffer, checked before allocating so
# that a small file whose header claims a huge shape stays small.
MAX_READ_VALUES = 1 << 28


def check_read_shape(shape: tuple[int, ...], what: str) -> None:
    """Raise `TraceFormatError` unless an array of `shape`, built from file `what`, holds at most MAX_READ_VALUES
    values (checked before it is allocated)."""
    values = math.prod(int(n) for n in shape)
    if values > MAX_READ_VALUES:
        raise TraceFormatError(f"{what} would hold {' x '.join(str(int(n)) for n in shape)} = {values:,} values, more "
                               f"than the {MAX_READ_VALUES:,} a trace may hold when read "
                               f"({MAX_READ_VALUES * 8 // 2**30} GiB as int64); split the recording into shorter ones")


def validate_counts(counts: np.ndarray, what: str = "counts", whole: bool = True) -> np.ndarray:
    """Check a [T, L, E] array of token counts and return it as int64 (with `whole` False: loads that may be
    fractional, such as means, returned as they are).

    Raises `TraceFormatError` for a wrong rank, an empty axis, NaN or infinite values, negative values,
    non-integral values (when `whole`) or more than `MAX_TOTAL_TOKENS` tokens in all (which int64 or float64 sums
    would not hold exactly), with a message that says what was found.
    """
    arr = np.asarray(counts)
    if arr.ndim != 3:
        raise TraceFormatError(
            f"{what} must be a 3-D array [steps, layers, experts]; found shape {tuple(arr.shape)}"
        )
    if min(arr.shape) == 0:
        raise TraceFormatError(f"{what} has an empty axis: shape {tuple(arr.shape)}; expected T, L, E >= 1")
    if arr.dtype.kind not in "iuf" and arr.dtype != np.bool_:
        raise TraceFormatError(f"{what} must hold numbers; found dtype {arr.dtype}")
    if arr.dtype.kind == "f":
        if not np.isfinite(arr).all():
            raise TraceFormatError(f"{what} contains NaN or infinite values; token counts must be finite")
        if whole and (arr != np.round(arr)).any():
            raise TraceFormatError(f"{what} contains non-integer values; token counts must be whole numbers")
    if (arr < 0).any():
        raise TraceFormatError(f"{what} contains negative values (min {arr.min()}); token counts must be >= 0")
    total = float(arr.sum(dtype=np.float64))
    if total > MAX_TOTAL_TOKENS:
        raise TraceFormatError(f"{what} holds {total:.3g} tokens in all; token counts must sum to at most 2^53 "
                               f"({MAX_TOTAL_TOKENS:.3g}) so that every sum and score of them is exact: scale them down")
    return arr.astype(np.int64, copy=False) if whole else arr


@dataclass(frozen=True)
class RoutingTrace:
    """A routing trace.

    Attributes:
        counts_TLE: [T, L, E] int64, tokens routed to each logical expert per step and layer (all top-k picks).
        header: the validated metadata.
    """

    counts_TLE: np.ndarray
    header: TraceHeader

    @classmethod
    def from_counts(
        cls,
        counts_TLE: np.ndarray,
        *,
        top_k: int | None = None,
        tokens_per_step: int | None = None,
        source: str = "",
    ) -> "RoutingTrace":
        """Validate `counts_TLE` and build a trace with a header derived from its shape."""
        counts = validate_counts(counts_TLE)
        _, num_layers, num_experts = counts.shape
        header = TraceHeader(
            num_layers=num_layers,
            num_experts=num_experts,
            top_k=top_k,
            tokens_per_step=tokens_per_step,
            source=source,
        )
        return cls(counts, header)

    def __post_init__(self) -> None:
        _, num_layers, num_experts = self.counts_TLE.shape
        if (num_layers, num_experts) != (self.header.num_layers, self.header.num_experts):
            raise TraceFormatError(
                f"trace header says {self.header.num_layers} layers x {self.header.num_experts} experts but counts "
                f"have shape {tuple(self.counts_TLE.shape)}"
            )

    @property
    def num_steps(self) -> int:
        return self.counts_TLE.shape[0]

    @property
    def num_layers(self) -> int:
        return self.counts_TLE.shape[1]

    @property
    def num_experts(self) -> int:
        return self.counts_TLE.shape[2]

    def steps(self, start: int, stop: int) -> "RoutingTrace":
        """The sub-trace of steps [start, stop)."""
        return RoutingTrace(self.counts_TLE[start:stop], self.header)

    def load_LE(self) -> np.ndarray:
        """[L, E] int64: tokens per logical expert summed over all steps."""
        return self.counts_TLE.sum(axis=0)
