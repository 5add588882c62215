"""Fixtures for every package's tests: a command started in a session of its own, so that a test can find every
process the command starts, at any depth, through /proc (their session id is the command's process id), and no
test leaks one: the fixture kills whatever is left of each session at the end. And TensorRT-LLM's side, written from
its source for the traces, placement and command-line tests alike: a dump in its expert-statistic layout, the checks
it runs on a moe_load_balancer.yaml, and the figure its report_load_statistics.py prints.
"""

import glob
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable

import pytest

PROC = "/proc"


class Session:
    """A command running as the leader of a new session (`start_new_session`), and the processes of that session."""

    def __init__(self, args: list[str], **popen_kwargs) -> None:
        self.process = subprocess.Popen(args, start_new_session=True, **popen_kwargs)
        self.sid = self.process.pid

    def members(self) -> dict[int, str]:
        """The session's processes that still run (zombies left out: they run nothing): pid -> command line."""
        found = {}
        for name in os.listdir(PROC):
            if not name.isdigit():
                continue
            try:
                with open(f"{PROC}/{name}/stat") as stat:
                    # pid (comm) state ppid pgrp session ...; comm may hold spaces and parentheses
                    state, _, _, session = stat.read().rsplit(")", 1)[1].split()[:4]
                with open(f"{PROC}/{name}/cmdline", "rb") as cmdline:
                    command = cmdline.read().replace(b"\0", b" ").decode(errors="replace").strip()
            except (OSError, ValueError):  # ended while we looked
                continue
            if int(session) == self.sid and state not in "ZX":
                found[int(name)] = command
        return found

    def wait_for(self, ready: Callable[[dict[int, str]], bool], timeout_s: float) -> dict[int, str]:
        """Poll `members()` until `ready(members)`; return them, or fail with what runs after `timeout_s`."""
        end = time.monotonic() + timeout_s
        while True:
            members = self.members()
            if ready(members):
                return members
            if time.monotonic() > end or self.process.poll() is not None:
                raise AssertionError(f"the session never got ready (leader exit code {self.process.poll()}); "
                                     f"running: {members}")
            time.sleep(0.1)

    def survivors_after(self, seconds: float) -> dict[int, str]:
        """The session's processes still running `seconds` from now (returns early once there are none)."""
        end = time.monotonic() + seconds
        while (members := self.members()) and time.monotonic() < end:
            time.sleep(0.1)
        return members

    def kill_all(self) -> None:
        for pid in self.members():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


@pytest.fixture
def new_session():
    """Start a command in a session of its own: `new_session(args, **popen_kwargs) -> Session`; every process of
    every session started is killed when the test ends."""
    if not os.path.exists(f"{PROC}/self/stat"):
        pytest.skip("finds a command's processes through /proc (Linux)")
    started: list[Session] = []

    def start(args: list[str], **popen_kwargs) -> Session:
        started.append(Session(args, **popen_kwargs))
        return started[-1]

    yield start
    for session in started:
        session.kill_all()


def _write_trtllm_dump(folder, counts_RTLE, layer_ids, first_iteration: int = 100, top_k: int | None = 2,
                       dtype: str = "int64"):
    """A TensorRT-LLM expert-statistic dump in `folder`, laid out as `tensorrt_llm/_torch/expert_statistic.py`
    writes it: `meta_info.json` ({"num_experts", "num_experts_per_token"}, rank 0's) and, per rank r,
    `rank<r>.safetensors` holding one 1-D tensor [E] named "<iteration>_<layer>" per recorded iteration and layer.
    `counts_RTLE` [R, T, L, E]: what rank r counted at iteration first_iteration + t in layer layer_ids[l]."""
    from pathlib import Path

    import numpy as np
    from safetensors.numpy import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    counts = np.asarray(counts_RTLE)
    (folder / "meta_info.json").write_text(json.dumps({"num_experts": counts.shape[3], "num_experts_per_token": top_k}))
    for rank, counts_TLE in enumerate(counts):
        records = {f"{first_iteration + t}_{layer}": np.ascontiguousarray(counts_TLE[t, l].astype(dtype))
                   for t in range(counts.shape[1]) for l, layer in enumerate(layer_ids)}
        save_file(records, str(folder / f"rank{rank}.safetensors"))
    return folder


@pytest.fixture(scope="session")
def write_trtllm_dump():
    """`write_trtllm_dump(folder, counts_RTLE [R, T, L, E], layer_ids, first_iteration=100, top_k=2, dtype="int64")
    -> folder`: a TensorRT-LLM expert-statistic dump as TensorRT-LLM lays it out (needs the safetensors package)."""
    pytest.importorskip("safetensors")
    return _write_trtllm_dump


# How each writer version of TensorRT-LLM's `tensorrt_llm/_torch/expert_statistic.py` treats
# EXPERT_STATISTIC_ITER_RANGE=START-STOP (eplb/engines/trtllm/README.md names the trees each was read in):
# "exclusive" records START <= i < STOP and writes rank<r>.safetensors when iteration STOP begins;
# "inclusive" records START <= i <= STOP, writes when the iteration after STOP begins, and adds
# rank<r>_raw.safetensors (each record's last raw top-k ids [N, K]) beside the counts.
TRTLLM_WRITERS = ("exclusive", "inclusive")


def _record_trtllm_dump(folder, topk_ids_RILNK, layer_ids, iter_range: str, num_experts: int,
                        writer: str = "exclusive"):
    """Run TensorRT-LLM's expert-statistic writer of version `writer` over a run of I iterations (0 .. I - 1) on R
    ranks and return `folder`, as it leaves it. `topk_ids_RILNK` [R, I, L, N, K]: the expert ids each rank's N
    tokens picked in each iteration and MoE layer (layer l is the model's layer layer_ids[l]). The writer's steps,
    per rank: each iteration it is told the iteration (which may write the files), then per layer the layer and the
    ids (which it counts when the iteration is in its range)."""
    from pathlib import Path

    import numpy as np
    from safetensors.numpy import save_file

    assert writer in TRTLLM_WRITERS, writer
    folder = Path(folder)
    start, stop = (int(part) for part in iter_range.split("-"))
    ids = np.asarray(topk_ids_RILNK)
    for rank in range(ids.shape[0]):
        counts, raw, meta, current = {}, {}, None, None

        def save() -> None:
            folder.mkdir(parents=True, exist_ok=True)
            if rank == 0:
                (folder / "meta_info.json").write_text(json.dumps(meta))
            save_file(counts, str(folder / f"rank{rank}.safetensors"))
            if writer == "inclusive":
                save_file(raw, str(folder / f"rank{rank}_raw.safetensors"))

        for iteration in range(ids.shape[1]):
            if writer == "inclusive" and current == stop:  # told the next iteration: the stop one is recorded
                save()
            current = iteration
            if writer == "exclusive" and current == stop:
                save()
            recording = start <= current < stop if writer == "exclusive" else start <= current <= stop
            for index, layer in enumerate(layer_ids):
                if not recording:
                    continue
                picks = ids[rank, iteration, index]
                meta = meta or {"num_experts": num_experts, "num_experts_per_token": int(picks.shape[-1])}
                key = f"{current}_{layer}"
                counts[key] = counts.get(key, 0) + np.bincount(picks.ravel(), minlength=num_experts).astype(np.int64)
                raw[key] = np.ascontiguousarray(picks.astype(np.int32))
    return folder


@pytest.fixture(scope="session")
def record_trtllm_dump():
    """`record_trtllm_dump(folder, topk_ids_RILNK, layer_ids, iter_range, num_experts, writer="exclusive") ->
    folder`: the dump TensorRT-LLM's writer of that version leaves after a run (see `TRTLLM_WRITERS`)."""
    pytest.importorskip("safetensors")
    return _record_trtllm_dump


def _tensorrt_llm_accepts(data, ep_size: int, num_experts: int, layer_ids) -> dict[int, list[list[int]]]:
    """Mirror of what TensorRT-LLM checks when it loads a `moe_load_balancer.yaml` (`yaml.safe_load`, then
    `MoeLoadBalancerConfig(**data)` in tensorrt_llm/llmapi/llm_args.py, its `setup(ep_rank, ep_size)`, and each MoE
    layer's checks in tensorrt_llm/_torch/modules/fused_moe/); AssertionError names the first check that fails.
    Returns {layer id: [ep_size lists of the expert ids each rank holds]}."""
    fields = {"num_slots", "initial_global_assignments", "layer_updates_per_iter"}
    assert isinstance(data, dict) and data.keys() <= fields, f"keys {sorted(data)} beyond {sorted(fields)}"
    num_slots, assignments = data.get("num_slots"), data.get("initial_global_assignments")
    assert type(num_slots) is int, f"num_slots must be an int; found {num_slots!r}"
    assert type(data.get("layer_updates_per_iter", 0)) is int, "layer_updates_per_iter must be an int"
    assert num_slots % ep_size == 0, f"num_slots {num_slots} not divisible by ep_size {ep_size}"
    assert isinstance(assignments, dict) and all(type(key) is int for key in assignments), "Dict[int, List[int]]"
    local = num_slots // ep_size
    by_rank = {}
    for layer in layer_ids:
        assert layer in assignments, f"layer_idx {layer} not found in initial_global_assignments"
        slots = assignments[layer]
        assert isinstance(slots, list) and all(type(e) is int for e in slots), f"layer {layer}: List[int]"
        assert len(slots) == num_slots, f"layer {layer}: {len(slots)} entries, num_slots {num_slots}"
        assert num_slots >= num_experts, f"num_slots {num_slots} < num_experts {num_experts}"
        assert set(slots) == set(range(num_experts)), f"layer {layer}: ids are not exactly 0..{num_experts - 1}"
        by_rank[layer] = [slots[rank * local:(rank + 1) * local] for rank in range(ep_size)]
    return by_rank


@pytest.fixture(scope="session")
def tensorrt_llm_accepts():
    """`tensorrt_llm_accepts(yaml_data, ep_size, num_experts, layer_ids) -> {layer: per-rank expert ids}`: the
    checks TensorRT-LLM runs on a moe_load_balancer.yaml, mirrored from its source."""
    return _tensorrt_llm_accepts


def _report_load_statistics(folder, projection=None) -> float:
    """The `average` row's imbalance-ratio of examples/wide_ep/ep_load_balancer/report_load_statistics.py, following
    its steps: sum the rank files' tensors per key, ep_size = number of rank files; per layer stack the iterations;
    with a projection file divide each expert's count by its replica count and index by slot, ep_size from the file;
    rank loads = consecutive blocks summed; per iteration max / mean - 1 in float32, mean over iterations; then the
    mean over layers as pandas takes it (NaN skipped)."""
    torch = pytest.importorskip("torch")
    pandas = pytest.importorskip("pandas")
    from safetensors.torch import load_file

    meta = json.loads((folder / "meta_info.json").read_text())
    files = [f for f in glob.glob(f"{folder}/rank*.safetensors") if not f.endswith("_raw.safetensors")]
    summed = {}
    for file in files:
        for key, tensor in load_file(file).items():
            summed[key] = summed.get(key, torch.zeros_like(tensor)) + tensor
    by_key = {tuple(int(part) for part in key.split("_")): tensor for key, tensor in summed.items()}
    layers = sorted({layer for _, layer in by_key})
    ratios = {}
    for layer in layers:
        counts = torch.stack([tensor for (_, lay), tensor in sorted(by_key.items()) if lay == layer])
        if projection is None:
            ep_size, slot_counts = len(files), counts
        else:
            ep_size = projection["ep_size"]
            assignment = torch.tensor(projection["initial_global_assignments"][layer])
            slot_counts = (counts / assignment.bincount(minlength=meta["num_experts"]))[:, assignment]
        ranks = slot_counts.reshape(counts.shape[0], ep_size, -1).sum(dim=-1).float()
        ratios[layer] = (ranks.max(dim=-1).values / ranks.mean(dim=-1) - 1).mean().item()
    return float(pandas.Series(ratios).mean())


@pytest.fixture(scope="session")
def report_load_statistics():
    """`report_load_statistics(dump_folder, projection=None) -> float`: TensorRT-LLM's report_load_statistics.py
    average imbalance-ratio, re-computed step by step (needs torch, pandas and safetensors)."""
    return _report_load_statistics
