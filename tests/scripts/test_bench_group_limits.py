"""`scripts/bench_group_limits.py` samples tokens with and without DeepSeek-V3's group limit (the limited tokens'
experts do fall in at most four groups) and reports both served imbalances."""

import numpy as np


def test_limited_tokens_pick_within_four_groups_and_the_table_has_both_columns(load_script, capsys):
    bench = load_script("bench_group_limits")
    rng = np.random.default_rng(1)
    log_popularity = rng.normal(0.0, 0.8, size=(1, bench.EXPERTS))
    one_token = bench.sample_counts(log_popularity, 1, True, rng)[0]
    groups = {int(expert) // (bench.EXPERTS // bench.GROUPS) for expert in np.flatnonzero(one_token)}
    assert one_token.sum() == bench.TOP_K and len(groups) <= bench.TOP_GROUPS
    assert bench.sample_counts(log_popularity, 50, False, rng).sum() == 50 * bench.TOP_K
    assert bench.main(["--quick"]) == 0
    row = capsys.readouterr().out.strip().splitlines()[-1].split("|")
    assert row[1].strip() == "16 x 17" and float(row[3]) >= 1.0 and float(row[4]) >= 1.0
