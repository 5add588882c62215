"""`scripts/hf_demo.py` generates with a tiny DeepSeek-V3, DeepSeek-V4 and Qwen3-MoE model on a real Gloo EP group
(its MoE blocks replaced) exactly the tokens of the unmodified model in one process, logits within 1e-4, no token
lost; and refuses bad flags with one line and exit 2."""

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


@pytest.mark.parametrize("arch, world_size, swapped, hashed", [
    ("deepseek_v3", 2, [1, 2], []), ("deepseek_v4", 2, [0, 1, 2], [0]), ("qwen3_moe", 2, [1, 2], []),
    ("qwen3_moe", 4, [1, 2], []),
], ids=["deepseek_v3-W2", "deepseek_v4-W2", "qwen3_moe-W2", "qwen3_moe-W4"])
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


@pytest.mark.parametrize("argv, message", [
    (["--arch", "llama"], "--arch: invalid choice"),
    (["--arch", "qwen3_moe", "--world-size", "4", "--batch", "3"], "--batch must be >= --world-size=4"),
    (["--arch", "qwen3_moe", "--new-tokens", "0"], "expected an integer in [1, 128], got 0"),
], ids=["unknown-arch", "batch-below-world-size", "no-new-tokens"])
def test_hf_demo_refuses_a_bad_flag_with_one_line_and_exit_2(demo, capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        demo.main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
