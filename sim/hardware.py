"""Cards the simulator can cost: peak figures as published, and the one set of efficiency factors applied to all.

Units: TFLOP/s dense (no 2:4 sparsity), GB = 1e9 bytes, bandwidths per card and per direction unless named.
"scale-up" is the fast domain a card shares with its `scale_up_domain_cards` neighbours (NVLink inside an 8-card
server; Huawei's Unified Bus across a whole 384-NPU CloudMatrix384); "scale-out" is the NIC to anything beyond.
"""

from pydantic import BaseModel, ConfigDict, Field


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
    """Achieved fraction of peak: time = work / (peak x factor) for compute, memory and network alike."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    compute: float = Field(gt=0, le=1, description="Fraction of dense FP8/INT8 and BF16 peak achieved.")
    memory: float = Field(gt=0, le=1, description="Fraction of HBM bandwidth achieved.")
    network: float = Field(gt=0, le=1, description="Fraction of scale-up and scale-out line rate achieved by the "
                                                   "all-to-all.")


CALIBRATED = Efficiency(compute=0.230, memory=0.70, network=0.78)
"""The one set of factors every profile and every experiment uses; never tuned per run.

Fitted through `sim.cost_model` to DeepSeek's published H800 fleet (tests/sim/test_cost_model.py checks that both
fleet rates are reproduced within 2%): `network` is what DeepEP's low-latency kernels achieve over the NIC's line
rate (the fleet rates cannot pin it: with two overlapped micro-batches the all-to-all hides under computation);
`compute` comes from the prefill rate, which is compute-bound; `memory` from the decode rate, which pins it only
weakly. Both rates are day averages over deployed nodes, so the factors include DeepSeek's own idle time and load
imbalance: a simulated node kept busy delivers DeepSeek's average rate, not a benchmark's peak, and saturated
benchmarks are predicted low (derivation and figures: docs/simulator.md, 'Calibration').
"""
