"""Every script refuses a flag it does not know in one line on stderr with exit 2 (no argparse usage block), as
`eplb` does; the scripts' own value checks have their tests beside each script."""

from pathlib import Path

import pytest

SCRIPTS = sorted(path.stem for path in (Path(__file__).resolve().parents[2] / "scripts").glob("*.py"))


@pytest.mark.parametrize("name", SCRIPTS)
def test_an_unknown_flag_is_one_line(load_script, capsys, name):
    script = load_script(name)
    with pytest.raises(SystemExit) as exit_info:
        script.main(["--no-such-flag"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1 and "usage:" not in err[0], err
