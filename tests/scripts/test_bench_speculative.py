"""`scripts/bench_speculative.py --quick --plot` prints where selective verification gains 6% over verify-all and
draws that gain over the batch; its plot flag refuses a project file before any work."""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_the_gain_is_tabulated_and_plotted(load_script, tmp_path, capsys):
    bench = load_script("bench_speculative")
    plot = tmp_path / "gain.png"
    assert bench.main(["--quick", "--plot", str(plot)]) == 0
    out = capsys.readouterr().out
    assert "first gains 6% over verify-all" in out and out.count("sequences per card") >= 3
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_plot_flag_refuses_a_file_that_is_not_a_png(load_script, capsys):
    bench = load_script("bench_speculative")
    before = (ROOT / "README.md").read_bytes()
    with pytest.raises(SystemExit) as exited:
        bench.main(["--quick", "--plot", str(ROOT / "README.md")])
    assert exited.value.code == 2 and "is not a PNG file" in capsys.readouterr().err
    assert (ROOT / "README.md").read_bytes() == before
