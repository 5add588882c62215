"""`scripts/bench_hash_layers.py` runs its zipf section end to end on a small shape and reports every variant for
hash and learned layers at every lag, each a mean imbalance of at least 1 over the fits it made."""

import json


def test_the_zipf_section_reports_every_variant_at_every_lag(load_script, tmp_path, capsys):
    bench = load_script("bench_hash_layers")
    out = tmp_path / "hash.json"
    assert bench.main(["--section", "zipf", "--quick", "--steps", "60", "--every", "20", "--window", "20",
                       "--lags", "0,20", "--time-limit", "0.2", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["zipf"][0]["rows"]
    variants = {(row["kind"], row["variant"], row["lag"]) for row in rows}
    assert variants == {(kind, variant, lag) for lag in (0, 20) for kind, variant in [
        ("hash", "window"), ("hash", "hindsight"), ("hash", "token table"), ("hash", "token table, fit once"),
        ("learned", "window"), ("learned", "hindsight"), ("learned", "fit once")]}
    assert all(row["imbalance_mean"] >= 1.0 and row["fits"] == (2 if row["lag"] == 0 else 1) for row in rows)
    assert "hash     token table" in capsys.readouterr().out
