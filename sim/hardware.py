"""Cards the simulator can cost: peak figures as published, and the one set of efficiency factors applied to all.

Units: TFLOP/s dense (no 2:4 sparsity), GB = 1e9 bytes, bandwidths per card and per direction unless named.
"scale-up" is the fast domain a card shares with its `scale_up_domain_cards` neighbours (NVLink inside an 8-card
server; Huawei's Unified Bus across a whole 384-NPU CloudMatrix384); "scale-out" is the NIC to anything beyond.
"""

from collections.abc import Iterator
from contextlib import contextmanager

from pydantic import BaseModel, ConfigDict, Field

from sim.calibration import fitted


class HardwareProfile(BaseModel):
    """One accelerator card and its links, as the vendor or the deploying paper states them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="Key in PROFILES and label in reports.")
    bf16_tflops: float = Field(gt=0, description="Dense BF16 tensor throughput, TFLOP/s (attention core).")
    lowp_tflops: float = Field(gt=0, description="Dense FP8 throughput, or INT8 TOP/s on Ascend, for the "
                                                 "weight matrices (TFLOP/s).")
    hbm_gb: float = Field(gt=0, description="Device memory capacity, GB (1e9 bytes).")
    hbm_tb_s: float = Field(gt=0, description="Device memory bandwidth, TB/s.")
    scale_up_gb_s: float = Field(gt=0, description="Scale-up bandwidth per card, one direction, GB/s.")
    scale_up_domain_cards: int = Field(ge=1, description="Cards reachable over scale-up (8 per NVLink server, 384 "
                                                         "in a CloudMatrix384 supernode).")
    scale_out_gb_s: float = Field(gt=0, description="Scale-out (NIC) bandwidth per card, one direction, GB/s.")
    price_per_hour_usd: float | None = Field(None, ge=0, description="Rental price per card-hour where a source "
                                                                     "states one; None otherwise.")


PROFILES: dict[str, HardwareProfile] = {
    # Each profile's figures are the vendor's or the deploying paper's, dense, per card and per direction; where
    # sources disagree the line rate is kept and `Efficiency` carries what kernels achieve (sources and choices:
    # docs/simulator.md, 'Hardware profiles').
    # NVIDIA H800 SXM: the Hopper part sold in China (compute and HBM as H100 SXM, NVLink cut); one 400 Gb/s NIC per
    # card; priced at the rental rate DeepSeek assumes.
    "H800": HardwareProfile(name="H800", bf16_tflops=989.0, lowp_tflops=1979.0, hbm_gb=80.0, hbm_tb_s=3.35,
                            scale_up_gb_s=200.0, scale_up_domain_cards=8, scale_out_gb_s=50.0,
                            price_per_hour_usd=2.0),
    # NVIDIA H100 SXM: the H800's compute and HBM with full NVLink (900 GB/s bidirectional); one 400 Gb/s NIC per card.
    "H100": HardwareProfile(name="H100", bf16_tflops=989.0, lowp_tflops=1979.0, hbm_gb=80.0, hbm_tb_s=3.35,
                            scale_up_gb_s=450.0, scale_up_domain_cards=8, scale_out_gb_s=50.0),
    # NVIDIA H20: Hopper with compute capped for export; the network assumed as in H100 HGX servers.
    "H20": HardwareProfile(name="H20", bf16_tflops=148.0, lowp_tflops=296.0, hbm_gb=96.0, hbm_tb_s=4.0,
                           scale_up_gb_s=450.0, scale_up_domain_cards=8, scale_out_gb_s=50.0),
    # Huawei Ascend 910C (two dies per package) in a CloudMatrix384 supernode, as its serving paper states it: the
    # Unified Bus reaches all 384 NPUs; no FP8, so the weight matrices run INT8 at twice the BF16 rate.
    "Ascend910C": HardwareProfile(name="Ascend910C", bf16_tflops=752.0, lowp_tflops=1504.0, hbm_gb=128.0,
                                  hbm_tb_s=3.2, scale_up_gb_s=392.0, scale_up_domain_cards=384,
                                  scale_out_gb_s=50.0),
    # NVIDIA L20: Ada on PCIe, sold in China; its listed peaks read as dense. Used for the vision encoder only.
    "L20": HardwareProfile(name="L20", bf16_tflops=119.5, lowp_tflops=239.0, hbm_gb=48.0, hbm_tb_s=0.864,
                           scale_up_gb_s=32.0, scale_up_domain_cards=8, scale_out_gb_s=25.0),
}


class Efficiency(BaseModel):
    """What kernels achieve: a fraction of peak (time = work / (peak x factor) for compute, memory and network
    alike), and the fixed times a pass pays whatever its work (per layer and micro-batch, in microseconds)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    compute: float = Field(gt=0, le=1, description="Fraction of dense FP8/INT8 peak at which the weight matrices "
                                                   "(GEMMs) run when compute-bound, end to end.")
    attention: float = Field(gt=0, le=1, description="Fraction of dense BF16 peak at which the attention core runs "
                                                     "when compute-bound, end to end.")
    memory: float = Field(gt=0, le=1, description="Fraction of HBM bandwidth achieved.")
    network: float = Field(gt=0, le=1, description="Fraction of scale-up and scale-out line rate achieved by the "
                                                   "all-to-all.")
    all_to_all_floor_us: float = Field(0.0, ge=0, le=10_000, description="Latency floor of one dispatch or one "
                                       "combine, microseconds per MoE layer and micro-batch: an all-to-all takes "
                                       "floor + bytes / (line rate x network).")
    layer_overhead_us: float = Field(0.0, ge=0, le=10_000, description="Fixed time per layer and micro-batch, "
                                     "microseconds, that overlaps with nothing: kernel launches, synchronisation and "
                                     "the many small kernels' minimum durations.")


CALIBRATED = Efficiency(compute=fitted("efficiency.compute"), attention=fitted("efficiency.attention"),
                        memory=fitted("efficiency.memory"), network=fitted("efficiency.network"),
                        all_to_all_floor_us=fitted("efficiency.all_to_all_floor_us"),
                        layer_overhead_us=fitted("efficiency.layer_overhead_us"))
"""The one set of factors every profile and every experiment uses; never tuned per run.

Read from the declared calibration (`sim/calibration.yaml`, `sim.calibration`), which names each factor's anchor
and the command that refits it; none is fitted on a deployment's day average. `memory` is FlashMLA's memory-bound
bandwidth and `network` DeepEP's low-latency all-to-all bandwidth over their H800 line rates; `compute` (the weight
matrices) and `attention` (the attention core) are solved together so that DeepSeek's profiled prefill and decode,
saturated and with perfectly balanced routing, deliver their published rates: end-to-end factors, below the kernels'
own peaks. How much of its capacity a deployed node delivers over a day is a separate fitted quantity
(`utilisation.day`, used by the fleet model and by day-average anchors only). The factors carry no expert
imbalance: a stage's imbalance multiplies its routed-expert work once, in `sim.cost_model` (derivation and figures:
docs/simulator.md, 'Calibration').
"""


_ACTIVE: list[Efficiency] = [CALIBRATED]


def active_efficiency() -> Efficiency:
    """The factors the cost model uses when a caller gives none: CALIBRATED, unless `efficiency_override` is on."""
    return _ACTIVE[-1]


@contextmanager
def efficiency_override(efficiency: Efficiency) -> Iterator[None]:
    """Cost everything inside the block with `efficiency` instead of CALIBRATED (the refit searches with it)."""
    _ACTIVE.append(efficiency)
    try:
        yield
    finally:
        _ACTIVE.pop()
