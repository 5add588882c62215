"""The `eplb` command line: one entry point with a subcommand per job (`demo`, `synth`, `place`, `score`, `replay`,
`plot`, `sim`), its plots, tables, progress bars and the checks on the paths it writes. Nothing imports this package
except the console script and `python -m eplb.cli`."""

from eplb.cli.flags import OneLineParser
from eplb.cli.main import main

__all__ = ["OneLineParser", "main"]
