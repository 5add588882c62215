"""Traffic scenarios: the constants of synthetic traffic that no source pins down, named and run as a range.

Two constants decide most of an imbalance the simulator predicts, and no production mix measures either:

- the popularity's skew (the lognormal sigma of `traces.synthetic`). Named readings (`SKEWS`):
  - `single-dataset`: the fitted `traffic.skew`, fitted on TensorRT-LLM's no-balancing figure, which its source
    measured on one dataset at a time;
  - `production-mix`: the sigma whose pooled popularity has the spread measured on ESFT's four tasks pooled
    (`traces.popularity_skew`: 0.510 measured, sigma 0.647 for the generator's own mix of domains);
  - `production-mix-olmoe`: the same on OLMoE's five domains pooled (0.394 measured, sigma 0.501);
- bursts (an expert's weight x4 for about 50 steps, 2 per 1,000 steps a layer): fitted to nothing, so a scenario
  axis, on or off (`BURSTS`).

A case is one (skew scenario, bursts, seed); `cases` crosses them. A figure run over the cases is reported as its
central value (the config as given) with the min and max over the cases beside it (`spread`): the range an operator
should read, not a point.
"""

from dataclasses import dataclass

from sim.config import SimConfig

# name -> (lognormal sigma of the generator, or None for the fitted traffic.skew; where it comes from)
SKEWS = {
    "single-dataset": (None, "traffic.skew, fitted on TensorRT-LLM's EP32 no-balancing figure (one dataset at a time)"),
    "production-mix": (0.647, "ESFT's four tasks pooled: log-load spread 0.510 (traces.popularity_skew)"),
    "production-mix-olmoe": (0.501, "OLMoE's five domains pooled: log-load spread 0.394 (traces.popularity_skew)"),
}
BURSTS = {"on": 2.0, "off": 0.0}  # bursts per layer per 1,000 steps
DEFAULT_SCENARIOS = ("single-dataset", "production-mix")
DEFAULT_SEEDS = 3


@dataclass(frozen=True)
class TrafficCase:
    """One reading of the traffic: a skew scenario (`SKEWS`), bursts on or off, and a seed."""

    scenario: str
    bursts: str
    seed: int

    @property
    def label(self) -> str:
        return f"{self.scenario}, bursts {self.bursts}, seed {self.seed}"


def cases(scenarios: tuple[str, ...] = DEFAULT_SCENARIOS, bursts: tuple[str, ...] = tuple(BURSTS),
          seeds: int = DEFAULT_SEEDS) -> list[TrafficCase]:
    """Every (scenario, bursts, seed) of the given names and seeds 0 .. seeds - 1.

    Raises:
        ValueError: an unknown scenario or bursts name, or seeds below 1.
    """
    unknown = [name for name in scenarios if name not in SKEWS] + [name for name in bursts if name not in BURSTS]
    if unknown:
        raise ValueError(f"unknown traffic scenario {unknown[0]!r}; scenarios: {', '.join(SKEWS)}; bursts: "
                         f"{', '.join(BURSTS)}")
    if seeds < 1:
        raise ValueError(f"seeds must be >= 1; got {seeds}")
    return [TrafficCase(scenario, burst, seed) for scenario in scenarios for burst in bursts for seed in range(seeds)]


def skew_of(scenario: str) -> float:
    """The generator's lognormal sigma of a skew scenario."""
    from sim.calibration import fitted

    value, _ = SKEWS[scenario]
    return fitted("traffic.skew") if value is None else value


def apply_case(config: SimConfig, case: TrafficCase) -> SimConfig:
    """`config` with its synthetic traffic read as `case`: the scenario's skew, its bursts, and `config.seed +
    case.seed` (so the seeds of a case set differ from the config's own draw only where case.seed > 0)."""
    balance = config.balance.model_copy(update={"skew": skew_of(case.scenario), "burst_rate": BURSTS[case.bursts]})
    return config.model_copy(update={"balance": balance, "seed": config.seed + case.seed})


def spread(central: float, values: list[float]) -> dict:
    """{"central", "min", "max"} of a figure: the config's own value and the extremes over its cases (the central
    value included)."""
    return {"central": central, "min": min([central, *values]), "max": max([central, *values])}
