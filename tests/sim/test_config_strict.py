"""The simulator's config is strict at every depth: a quoted number, a boolean where a number belongs or a string
where a boolean belongs is refused in one error naming the dotted key, in the nested sections (fleet, speculative,
model) as at the top; a plain number with an exponent (608.0e9) is a number, as JSON and YAML 1.2 read it; and a fuzz
of hostile values (booleans, quoted numbers, NaN, infinities, huge integers, lists, mappings, null) at any field of
any depth is read as given or refused in one line naming the field."""

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


# ---- fuzz: any value at any field of any depth -------------------------------------------------------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from pydantic import BaseModel  # noqa: E402

from sim.config import SimConfig  # noqa: E402


def _leaf_paths(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every field of the config, nested sections walked into: (section, ..., field)."""
    paths = []
    for name, info in model.model_fields.items():
        inner = info.annotation
        if isinstance(inner, type) and issubclass(inner, BaseModel):
            paths += _leaf_paths(inner, prefix + (name,))
        else:
            paths.append(prefix + (name,))
    return paths


LEAVES = _leaf_paths(SimConfig)
HOSTILE = st.one_of(st.booleans(), st.sampled_from(["yes", "1", "2.5", "", "nan", "inf", "-1", "H800", "none"]),
                    st.integers(-2**70, 2**70), st.floats(allow_nan=False, allow_infinity=False),
                    st.sampled_from([float("nan"), float("inf"), -float("inf"), 1e300, -1e300, 0.0, -0.0]),
                    st.lists(st.integers(-5, 5), max_size=3), st.dictionaries(st.sampled_from(["a", "b"]),
                                                                             st.integers(), max_size=2),
                    st.none())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fields=st.lists(st.tuples(st.sampled_from(LEAVES), HOSTILE), min_size=1, max_size=3,
                       unique_by=lambda field: field[0]))
def test_any_value_at_any_field_is_read_or_refused_in_one_line_naming_it(tmp_path, fields):
    import json

    document: dict = {}
    for path, value in fields:
        node = document
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
    file = tmp_path / "fuzz.json"  # JSON keeps NaN and infinities as they are (YAML would need their spellings)
    file.write_text(json.dumps(document))
    try:
        config = load_sim_config(file)
    except SimConfigError as exc:
        message = str(exc)
        assert "\n" not in message and len(message) < 1200, message
        assert any(".".join(path) in message or path[0] in message for path, _ in fields), message
        return
    for path, value in fields:  # read: each value is the field's as given, of the field's own type
        read = config
        for key in path:
            read = getattr(read, key)
        assert not isinstance(value, str) or isinstance(read, str), (path, value, read)
        assert not isinstance(value, bool) or isinstance(read, bool), (path, value, read)
