"""`scripts/hf_demo.py` generates with a tiny DeepSeek-V3, DeepSeek-V4 and Qwen3-MoE model on a real Gloo EP group
(its MoE blocks replaced) exactly the tokens of the unmodified model in one process, logits within 1e-4, no token
lost: as placed, across a rebalance that moves weights and switches mid-generation, and after a rank is killed
mid-forward (its sequences re-prefilled on the survivors); and refuses bad flags with one line and exit 2."""

import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "hf_demo.py"
KEYS = {"arch", "world_size", "seed", "config", "prompt", "tokens", "tokens_reference", "tokens_identical",
        "max_abs_logit_diff", "layers_swapped", "hash_layers", "imbalance_measured", "tokens_lost"}


@pytest.fixture(scope="module")
def demo(load_script):
    """The script loaded as a module, to call its `main` in this process."""
    return load_script("hf_demo")


ARCH_LAYERS = [("deepseek_v3", [1, 2], []), ("deepseek_v4", [0, 1, 2], [0]), ("qwen3_moe", [1, 2], [])]


@pytest.mark.parametrize("arch, world_size, swapped, hashed",
                         [(arch, world_size, swapped, hashed) for arch, swapped, hashed in ARCH_LAYERS
                          for world_size in (2, 4)],
                         ids=[f"{arch}-W{world_size}" for arch, _, _ in ARCH_LAYERS for world_size in (2, 4)])
def test_hf_demo_generates_the_unmodified_models_tokens_on_an_ep_group(demo, capsys, arch, world_size, swapped,
                                                                        hashed):
    pytest.importorskip("transformers")
    assert demo.main(["--arch", arch, "--world-size", str(world_size), "--new-tokens", "3", "--seed", "1",
                      "--batch", str(world_size), "--prompt-length", "5", "--json"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert KEYS <= report.keys()
    assert report["arch"] == arch and report["world_size"] == world_size and report["seed"] == 1
    assert len(report["prompt"]) == world_size and len(report["prompt"][0]) == 5
    assert len(report["tokens"]) == world_size and all(len(row) == 3 for row in report["tokens"])
    assert report["tokens_identical"] and report["tokens"] == report["tokens_reference"]
    assert report["max_abs_logit_diff"] < 1e-4 and report["tokens_lost"] == 0
    assert report["layers_swapped"] == swapped and report["hash_layers"] == hashed
    assert report["imbalance_measured"] >= 1.0


@pytest.mark.parametrize("arch", [arch for arch, _, _ in ARCH_LAYERS])
def test_hf_demo_tokens_are_identical_across_a_rebalance_mid_generation(demo, capsys, arch):
    pytest.importorskip("transformers")
    assert demo.main(["--arch", arch, "--world-size", "4", "--new-tokens", "9", "--seed", "3", "--batch", "4",
                      "--prompt-length", "6", "--rebalance-at", "2", "--timeout", "20", "--json"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert KEYS | {"rebalances", "requests_requeued"} <= report.keys() and "failed_rank" not in report
    assert report["tokens_identical"] and report["max_abs_logit_diff"] < 1e-4 and report["tokens_lost"] == 0
    # One rebalance: fitted on the recorder's first forwards, switched before the last, experts moved over the group.
    assert report["rebalances"] == 1 and 2 < report["switch_forwards"][0] < 9
    assert report["bytes_moved"] > 0 and report["experts_moved"] > 0
    assert report["recoveries"] == [] and report["requests_requeued"] == 0
    assert report["logits_compared"] == 4 * 9


@pytest.mark.parametrize("arch, world_size, fail_rank", [
    ("deepseek_v3", 2, 0), ("deepseek_v3", 4, 2), ("deepseek_v4", 2, 1), ("deepseek_v4", 4, 0),
    ("qwen3_moe", 2, 1), ("qwen3_moe", 4, 3),
], ids=["deepseek_v3-W2", "deepseek_v3-W4", "deepseek_v4-W2", "deepseek_v4-W4", "qwen3_moe-W2", "qwen3_moe-W4"])
def test_hf_demo_tokens_are_identical_across_a_rebalance_and_a_killed_rank(demo, capsys, arch, world_size,
                                                                           fail_rank):
    pytest.importorskip("transformers")
    assert demo.main(["--arch", arch, "--world-size", str(world_size), "--new-tokens", "10", "--seed", "2",
                      "--batch", str(world_size + 1), "--prompt-length", "4", "--rebalance-at", "1",
                      "--fail-rank", str(fail_rank), "--fail-at-token", "8", "--timeout", "20", "--json"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert KEYS | {"rebalances", "failed_rank", "requests_requeued"} <= report.keys()
    assert report["tokens_identical"] and report["tokens"] == report["tokens_reference"]
    assert report["max_abs_logit_diff"] < 1e-4 and report["tokens_lost"] == 0
    # The rebalance switched before the kill (rank 0 waits for its solve, so the switch comes a few forwards after
    # token 1); the kill came in forward 8 of 10, and the survivors finished every sequence.
    assert report["rebalances"] >= 1 and report["switch_forwards"][0] < 8
    assert report["failed_rank"] == fail_rank and len(report["recoveries"]) == 1
    assert report["recoveries"][0]["lost_ranks"] == [fail_rank]
    lost_sequences = len(range(world_size + 1)[fail_rank + (fail_rank > 0):][: 1 + (fail_rank == 0)])
    assert report["requests_requeued"] == lost_sequences
    # Every token of every sequence was compared, except those the killed rank picked before it died.
    assert report["logits_compared"] == (world_size + 1) * 10 - lost_sequences * 8


@pytest.mark.parametrize("argv, message", [
    (["--arch", "llama"], "--arch: invalid choice"),
    (["--arch", "qwen3_moe", "--world-size", "4", "--batch", "3"], "--batch must be >= --world-size=4"),
    (["--arch", "qwen3_moe", "--new-tokens", "0"], "expected an integer in [1, 128], got 0"),
    (["--arch", "qwen3_moe", "--fail-rank", "1"], "--fail-rank and --fail-at-token go together"),
    (["--arch", "qwen3_moe", "--world-size", "2", "--fail-rank", "2", "--fail-at-token", "1"],
     "--fail-rank must name one of the ranks 0..1"),
    (["--arch", "qwen3_moe", "--new-tokens", "4", "--rebalance-at", "4"],
     "--rebalance-at must be below --new-tokens=4"),
], ids=["unknown-arch", "batch-below-world-size", "no-new-tokens", "fail-rank-alone", "fail-rank-outside",
        "rebalance-after-the-end"])
def test_hf_demo_refuses_a_bad_flag_with_one_line_and_exit_2(demo, capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        demo.main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
