"""The traffic cases of `--scenarios`, `--bursts` and `--seeds` (`eplb sim --capacity`, `eplb advise`)."""

import argparse


def traffic_cases(args: argparse.Namespace) -> list:
    """The traffic cases of --scenarios, --bursts and --seeds (`sim.scenarios.cases`); none with --scenarios none."""
    from sim.scenarios import cases

    if args.scenarios.strip() == "none":
        return []
    names = tuple(name.strip() for name in args.scenarios.split(",") if name.strip())
    bursts = tuple(name.strip() for name in args.bursts.split(",") if name.strip())
    try:
        return cases(names, bursts, args.seeds)
    except ValueError as exc:
        raise ValueError(f"--scenarios/--bursts: {exc}") from None
