"""TensorRT-LLM's moe_load_balancer.yaml from a placement: it parses back (yaml.safe_load) into exactly the keys and
value types MoeLoadBalancerConfig takes, passes every check TensorRT-LLM runs on it, holds the placement's map
keyed by the model's layer ids with slot p on rank p // S, and a mismatch of layer ids is refused."""

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from eplb.engines.trtllm.load_balancer_file import (mtp_stand_ins, parse_layer_ids, save_trtllm_config, trtllm_config,
                                                    trtllm_yaml)
from placement import ClusterSpec, Placement, PlacementFormatError, fit_placement
from traces.model_layers import MAX_MODEL_LAYERS

CLUSTER = ClusterSpec(num_gpus=4, slots_per_gpu=5)  # P = 20 slots for E = 16 experts
LAYER_IDS = (3, 4, 5)


@pytest.fixture(scope="module")
def placement() -> Placement:
    counts = np.random.default_rng(0).integers(0, 100, size=(30, len(LAYER_IDS), 16))
    return fit_placement("deepseek", counts, CLUSTER)


def test_yaml_parses_back_to_what_tensorrt_llm_accepts_for_ep_size_g(placement, tmp_path, tensorrt_llm_accepts):
    save_trtllm_config(placement, tmp_path / "moe_load_balancer.yaml", LAYER_IDS)
    data = yaml.safe_load((tmp_path / "moe_load_balancer.yaml").read_text())
    assert set(data) == {"num_slots", "initial_global_assignments", "layer_updates_per_iter"}
    assert (data["num_slots"], data["layer_updates_per_iter"]) == (20, 0)
    by_rank = tensorrt_llm_accepts(data, ep_size=4, num_experts=16, layer_ids=LAYER_IDS)
    assert list(data["initial_global_assignments"]) == list(LAYER_IDS)
    for index, layer in enumerate(LAYER_IDS):
        assert data["initial_global_assignments"][layer] == placement.phy2log_LP[index].tolist()
        for rank, experts in enumerate(by_rank[layer]):  # rank r holds slots r * S .. r * S + S - 1
            slots = np.flatnonzero(placement.gpu_of_slot_P == rank)
            assert experts == placement.phy2log_LP[index, slots].tolist()


def test_yaml_says_the_ep_size_its_slots_are_grouped_for(placement):
    assert trtllm_yaml(placement, LAYER_IDS).startswith("# TensorRT-LLM MoeLoadBalancerConfig written by eplb: "
                                                        "serve with ep_size 4 (4 ranks x 5 slots)")


def test_an_ep_size_that_does_not_divide_the_slots_fails_tensorrt_llm_s_check(placement, tensorrt_llm_accepts):
    """The mirror itself catches what TensorRT-LLM refuses (num_slots % ep_size)."""
    with pytest.raises(AssertionError, match="not divisible by ep_size 3"):
        tensorrt_llm_accepts(yaml.safe_load(trtllm_yaml(placement, LAYER_IDS)), 3, 16, LAYER_IDS)


def test_an_mtp_layer_without_statistics_holds_the_last_layers_placement_and_the_file_says_so(
        placement, tensorrt_llm_accepts):
    """TensorRT-LLM serving with MTP also looks up the MTP layer (61 for DeepSeek-V3) and raises KeyError without it."""
    text = trtllm_yaml(placement, LAYER_IDS, mtp_layer_ids=(61,))
    data = yaml.safe_load(text)
    tensorrt_llm_accepts(data, ep_size=4, num_experts=16, layer_ids=(*LAYER_IDS, 61))
    assert list(data["initial_global_assignments"]) == [*LAYER_IDS, 61]
    assert data["initial_global_assignments"][61] == placement.phy2log_LP[-1].tolist()
    assert "# MTP layer 61: a stand-in, layer 5's placement (the trace holds no statistics of layer 61" in text
    with pytest.raises(AssertionError, match="layer_idx 61 not found"):  # what the file lacks without it
        tensorrt_llm_accepts(yaml.safe_load(trtllm_yaml(placement, LAYER_IDS)), 4, 16, (*LAYER_IDS, 61))


def test_an_mtp_layer_the_placement_was_fitted_on_keeps_its_own_row(placement):
    config = trtllm_config(placement, (3, 4, 61), mtp_layer_ids=(61, 62))
    assert config["initial_global_assignments"][61] == placement.phy2log_LP[2].tolist()
    assert config["initial_global_assignments"][62] == placement.phy2log_LP[1].tolist()  # the last decoder layer's
    assert mtp_stand_ins((3, 4, 61), (61, 62)) == {62: 4}
    assert "# MTP layer 61: fitted on its own statistics in the trace" in trtllm_yaml(placement, (3, 4, 61), (61,))


@pytest.mark.parametrize(("mtp", "expected"), [
    ((2,), "names layer 2, which is neither a layer of the placement (3..5) nor above its last"),
    ((61, 61), "repeats a layer"),
    ((3, 4, 5, 61), "names every layer of the placement"),
], ids=["below-the-decoder-layers", "repeated", "no-decoder-layer"])
def test_mtp_layer_ids_that_cannot_be_mtp_layers_are_refused(placement, mtp, expected):
    with pytest.raises(PlacementFormatError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        trtllm_config(placement, LAYER_IDS, mtp_layer_ids=mtp)


@pytest.mark.parametrize(("layer_ids", "expected"), [
    ((3, 4), "names 2 layers but the placement has 3"),
    ((3, 5, 4), "ascending"),
    ((3, 3, 4), "ascending"),
    ((-1, 0, 1), ">= 0"),
], ids=["too-few", "unordered", "repeated", "negative"])
def test_layer_ids_that_do_not_fit_the_placement_are_refused(placement, tmp_path, layer_ids, expected):
    with pytest.raises(PlacementFormatError, match=expected):
        save_trtllm_config(placement, tmp_path / "m.yaml", layer_ids)
    assert not (tmp_path / "m.yaml").exists()


@pytest.mark.parametrize(("text", "ids"), [
    ("3-60", tuple(range(3, 61))), ("1,3,5", (1, 3, 5)), ("0-2,5", (0, 1, 2, 5)), ("7", (7,)),
], ids=["deepseek-v3", "list", "range-and-id", "one"])
def test_layer_ids_parse_from_ranges_and_lists(text, ids):
    assert parse_layer_ids(text) == ids


@pytest.mark.parametrize("text", ["", "a", "5-3", "3,3", "3-", "-3", "3-5,4"],
                         ids=["empty", "word", "backwards", "repeated", "open-end", "negative", "overlap"])
def test_layer_ids_that_are_not_an_ascending_list_are_refused(text):
    with pytest.raises(ValueError):
        parse_layer_ids(text)


@settings(max_examples=80, deadline=None, derandomize=True, database=None)
@given(text=st.one_of(
    st.text(alphabet="0123456789-,٣ ", max_size=40),
    st.lists(st.tuples(st.integers(0, 10**25), st.one_of(st.none(), st.integers(0, 10**25))), min_size=1,
             max_size=5).map(lambda items: ",".join(f"{a}" if b is None else f"{a}-{b}" for a, b in items))))
def test_any_layer_id_text_gives_model_layers_or_one_line_at_once(text):
    """Ids of any size and ranges of any length: at most MAX_MODEL_LAYERS ascending ids below it, or a ValueError,
    without expanding a range first."""
    try:
        ids = parse_layer_ids(text)
    except ValueError as exc:
        assert "\n" not in str(exc) and len(str(exc)) < 200
    else:
        assert all(0 <= layer < MAX_MODEL_LAYERS for layer in ids) and list(ids) == sorted(set(ids))
