"""`eplb synth --requests`'s work bound: any shape is either refused in one line with its estimate, or estimated
within the bound."""

from hypothesis import given, settings
from hypothesis import strategies as st

from eplb.cli.synth_checks import MAX_DRAWN_VALUES, check_work
from traces import TraceFormatError
from traces.request_traffic import RequestTrafficConfig


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(mode=st.sampled_from(["prefill", "decode"]), steps=st.integers(1, 10**6), layers=st.integers(1, 512),
       experts=st.integers(9, 4096), tokens=st.integers(1, 1 << 20), prompt=st.floats(1, 1e7),
       output=st.floats(1, 1e7))
def test_any_request_traffic_shape_is_refused_with_its_estimate_or_within_the_bound(mode, steps, layers, experts,
                                                                                      tokens, prompt, output):
    try:
        config = RequestTrafficConfig(mode=mode, num_steps=steps, num_layers=layers, num_experts=experts,
                                      tokens_per_step=tokens, prompt_tokens=prompt, output_tokens=output)
    except ValueError:
        return  # the config's own limits (the live set, the trace's size)
    try:
        check_work(config)
    except TraceFormatError as exc:
        assert "\n" not in str(exc) and "values, about" in str(exc)
    else:
        live = tokens if mode == "decode" else 0
        assert live * layers * experts <= MAX_DRAWN_VALUES
