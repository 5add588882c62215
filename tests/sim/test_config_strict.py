"""The simulator's config is strict at every depth: a quoted number, a boolean where a number belongs or a string
where a boolean belongs is refused in one error naming the dotted key, in the nested sections (fleet, speculative,
model) as at the top; a plain number with an exponent (608.0e9) is a number, as JSON and YAML 1.2 read it."""

import pytest

from sim.config import SimConfigError, load_sim_config

REFUSED = [
    ("fleet: {days: true}", "fleet.days"),
    ("fleet: {autoscaler: {quota_nodes: '400'}}", "fleet.autoscaler.quota_nodes"),
    ("fleet: {traffic: {prompt_length_spread: '2.72'}}", "fleet.traffic.prompt_length_spread"),
    ("fleet: {store: {start_empty: 'yes'}}", "fleet.store.start_empty"),
    ("fleet: {traffic: {input_tokens_per_day: true}}", "fleet.traffic.input_tokens_per_day"),
    ("speculative: {enabled: 'yes'}", "speculative.enabled"),
    ("speculative: {draft_tokens: true}", "speculative.draft_tokens"),
    ("model: {num_routed_experts: '64'}", "model.num_routed_experts"),
    ("balance: {layers: '4'}", "balance.layers"),
]


@pytest.mark.parametrize("text, key", REFUSED, ids=[key for _, key in REFUSED])
def test_a_value_of_the_wrong_type_is_refused_at_any_depth(tmp_path, text, key):
    path = tmp_path / "config.yaml"
    path.write_text(text + "\n")
    with pytest.raises(SimConfigError, match=key.replace(".", r"\.")):
        load_sim_config(path)


def test_numbers_with_an_exponent_lists_for_pairs_and_ints_for_floats_are_read(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("fleet:\n  traffic: {input_tokens_per_day: 608.0e9, output_tokens_per_day: 1.68e+11,"
                    " peak_to_mean: 1}\n  prices: {valley_hours: [1, 9]}\nmodel: {compressed_layers: [3, 5]}\n")
    config = load_sim_config(path)
    assert config.fleet.traffic.input_tokens_per_day == 608e9 and config.fleet.traffic.output_tokens_per_day == 168e9
    assert config.fleet.traffic.peak_to_mean == 1.0 and config.fleet.prices.valley_hours == (1.0, 9.0)
    assert config.model.compressed_layers == (3, 5)
