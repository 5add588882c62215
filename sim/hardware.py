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
    # NVIDIA H800 SXM (the Hopper part sold in China; compute and HBM as H100 SXM, NVLink cut).
    # - 989 BF16 / 1,979 FP8 dense TFLOP/s, 80 GB HBM3, 3.35 TB/s: NVIDIA H100 SXM datasheet (H800 SXM shares them).
    # - NVLink 400 GB/s bidirectional = 200 GB/s per direction (NVIDIA H800 product brief). DeepSeek-V3 report
    #   (arXiv 2412.19437, sec. 3.2.2) and DeepEP's README measure ~160 GB/s: sources disagree; we keep the 200 GB/s
    #   line rate and let Efficiency.network carry what kernels achieve.
    # - Scale-out: one CX7 400 Gb/s InfiniBand NIC per GPU, 8 x 400 Gb/s per node = 50 GB/s per card
    #   (DeepSeek-V3 report sec. 3.1; DeepEP README "~50 GB/s maximum bandwidth").
    # - $2 per GPU-hour: the rental price DeepSeek assumes in its Day-6 inference-system post (Mar 2025).
    "H800": HardwareProfile(name="H800", bf16_tflops=989.0, lowp_tflops=1979.0, hbm_gb=80.0, hbm_tb_s=3.35,
                            scale_up_gb_s=200.0, scale_up_domain_cards=8, scale_out_gb_s=50.0,
                            price_per_hour_usd=2.0),
    # NVIDIA H20 (Hopper, compute capped for export): 148 BF16 / 296 FP8 dense TFLOP/s, 96 GB HBM3, 4.0 TB/s,
    # NVLink 900 GB/s bidirectional = 450 GB/s per direction (NVIDIA H20 product brief, as reported by
    # willitrunai.com and others; a few pages say HBM3e). Scale-out: one 400 Gb/s NIC per GPU assumed, as in H100
    # HGX servers (a trade report says H20 servers keep the H100 network design) = 50 GB/s.
    "H20": HardwareProfile(name="H20", bf16_tflops=148.0, lowp_tflops=296.0, hbm_gb=96.0, hbm_tb_s=4.0,
                           scale_up_gb_s=450.0, scale_up_domain_cards=8, scale_out_gb_s=50.0),
    # Huawei Ascend 910C (two dies per package) in a CloudMatrix384 supernode, per Zuo et al., "Serving Large
    # Language Models on Huawei CloudMatrix384" (arXiv 2506.12708, sec. 3): 752 TFLOP/s BF16 (2 x 376), 128 GB,
    # 3.2 TB/s per NPU; Unified Bus 392 GB/s per direction per NPU to any of the 384 NPUs; RDMA (RoCE) plane
    # 400 Gb/s = 50 GB/s per NPU. Other sources say 780 or 800 TFLOP/s BF16 (TechPowerUp/DigiTimes, 2025): we keep
    # the paper's 752. No FP8: INT8 at twice BF16 = 1,504 TOP/s, the figure the paper's tokens/s-per-TFLOPS
    # ratios imply (6,688 / 4.45 = 1,503).
    "Ascend910C": HardwareProfile(name="Ascend910C", bf16_tflops=752.0, lowp_tflops=1504.0, hbm_gb=128.0,
                                  hbm_tb_s=3.2, scale_up_gb_s=392.0, scale_up_domain_cards=384,
                                  scale_out_gb_s=50.0),
    # NVIDIA L20 (Ada, PCIe, sold in China): 48 GB GDDR6, 864 GB/s, PCIe 4.0 x16 = 32 GB/s per direction
    # (NVIDIA L20 product brief; TechPowerUp database). 119.5 BF16 / 239 FP8 TFLOP/s as NVIDIA China lists them;
    # the brief does not say dense or sparse: we read them as dense (half of what its 92 Ada SMs would give at
    # L40S rates, consistent with the export cap). Scale-out: a 200 Gb/s NIC (25 GB/s), as trade reports say L20
    # servers ship with. Used for the vision encoder only.
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

Fitted to DeepSeek's published H800 figures (open-infra-index Day-6 post, Mar 2025; DeepEP README) through
`sim.cost_model`; tests/sim/test_cost_model.py checks both fleet rates are reproduced within 2%:

- network = 39 / 50 = 0.78. DeepEP's low-latency kernels, the ones DeepSeek decodes with, reach 39 GB/s per H800
  at EP128 and EP256 (dispatch and combine alike) over a ~50 GB/s CX7 NIC. The fleet rates cannot pin this
  factor: with two overlapped micro-batches the all-to-all hides under computation at both calibration points.
- compute = 0.230, from prefill. A prefill node computes (1 - 0.563) x 73,700 = 32,207 new tokens/s, 4,026 per
  GPU. Taking the average prompt as long as the average KV length (4,989 = 2,809 cached + 2,180 new), a new token
  costs 74.0 GFLOP of weight products in FP8 (71.4 for the decoder weights + 2.6 to up-project the cached
  latents it attends to) and 19.5 GFLOP of attention core in BF16. Busy fraction at peak:
  4,026 x (74.0e9 / 1,979e12 + 19.5e9 / 989e12) = 4,026 x 57.1 us = 0.230. Prefill is compute-bound (weight and
  KV reads take under 2% of that), so compute = 0.230. A shorter average prompt would lower it a little: the
  attention core is a fifth of the FLOPs.
- memory = 0.70, from decode. 14,800 tok/s per node at 21 tok/s per user (mid of 20-22) is 705 sequences per node,
  88.1 per GPU, one step per 47.6 ms at an average KV of 4,989. At compute = 0.230 the compute-bound parts take
  45.2 ms: attention 37.2 (7.55 ms of BF16 core + 1.02 of FP8 projections at peak) and routed experts 7.9; the
  dense part (dense FFNs, shared experts, BF16 output head: 5.70 GB per GPU, 1.70 ms at peak bandwidth) is
  read-bound and fills the remaining 2.43 ms at 0.70. The decode rate pins this factor weakly: anything from 0.5
  to 1.0 keeps it within 2%. At 0.70 the attention part's reads (30.9 GB of KV + 11.4 GB of MLA weights per GPU)
  take 18 ms, under its 37 ms of compute: MLA's 128 heads make DeepSeek's H800 decode compute-bound here.

Both H800 rates are day averages over deployed nodes, so these factors include DeepSeek's own idle time and load
imbalance: a simulated node kept busy delivers DeepSeek's average rate, not a benchmark's peak. Against
CloudMatrix384's saturated benchmarks the model therefore predicts low (prefill -44%, decode -16%); see
tests/sim/test_cost_model.py.
"""
