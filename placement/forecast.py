"""Forecast the traffic a placement will serve: the fit window's steps moved along each expert's trend.

Legend: T window steps, L layers, E logical experts, K horizons (chunks of the forecast window).

A placement fitted on the last window serves the steps that come after it: from `lag` steps after the window ends
(the solve and the weight transfer) until the next placement lands. When traffic drifts, the window's mean load is
stale by then, and the held-out imbalance grows with the staleness (figures: docs/placement.md, 'Forecasting the
load'). `forecast_window` hands the policy a window of the same shape whose steps carry the loads the served steps
may carry, so any policy fits the traffic to come with no change to the policy itself:

1. Each row's tokens become shares of that row's total (a step's batch size is not drift).
2. Per layer and expert, a least-squares line through the shares over the window: a level and a slope. A slope
   within two standard errors of zero (its noise, from the line's residuals) is dropped, and a larger one shrunk by
   max(0, 1 - 4 se^2 / b^2), so that sampling noise (few tokens, or traffic that does not move) moves nothing and
   a clear trend moves almost in full. A slope is also dropped unless the lines through each half of the window
   slope the same way: a burst that began or ended within the window is a step, not a trend, and extrapolating it
   as one overshoots.
3. At h steps after the window ends, the forecast share is the line's value at the window's end plus the slope
   times h (or, with `damping_steps` tau, times tau * (1 - exp(-h / tau)): a damped trend). A share is kept above a
   quarter of its window mean (a falling line does not reach zero), and each horizon's shares sum to 1.
4. The window's rows are split in K consecutive chunks, K = `len(horizons)`; chunk k's rows are rescaled per expert
   so that the chunk's share of each expert is the forecast at horizons[k], each row keeping its total tokens
   (iterative proportional fitting). The step-to-step noise of the window stays in the rows; only the means move.

When: `trend_supported`. A trend is drawn only where the window's own later steps confirm it: at each of four
origins in the window's second half, the steps before the origin forecast the mean share of the steps after it three
ways, by the trend above, by no change (their mean) and by their recent level (the mean of their second half). The
trend is used only if it beats no change at every origin and the recent level over all of them; otherwise
`hedged_window` returns the window as it is. A short window (fewer than 8 steps) or noisy one gives a slope that
does not predict the window's own next steps, and a level shift inside the window (a burst, a switch of task) is
better told by the recent level; extrapolated as a line, either moves the fit away from the load that comes next.

Which horizons: `hedged_horizons`. Under-forecasting an expert that rises costs a replica where it is needed, while
over-forecasting one costs little (its spare replica still carries tokens), so the fit covers the whole range from
no change (h = 0) to the trend at the middle of the served period; the policy's objective, a mean over the rows,
then asks for a placement that serves both. Measured alternatives (a point forecast, damped trends, low-rank
denoising, synthetic bursts) are in docs/placement.md.
"""

import numpy as np

# A forecast share is kept above this fraction of the expert's window mean share.
FLOOR_OF_MEAN = 0.25
# A slope b with standard error se is kept times max(0, 1 - SHRINK * se^2 / b^2): 4 drops those under 2 se.
SHRINK = 4.0
# Rounds of iterative proportional fitting that move a chunk's rows to its forecast shares.
FITTING_ROUNDS = 8
# Windows at least this long also check that each half slopes the way the whole does.
MIN_STEPS_FOR_HALVES = 8
# The fewest window steps a trend is drawn from at all (`trend_supported`).
MIN_STEPS_FOR_TREND = 8
# Origins in the window's second half at which the trend must forecast the steps after them (`trend_supported`).
HOLDOUT_ORIGINS = 4


def trend_shares(counts_TLE: np.ndarray, horizons, damping_steps: float | None = None) -> np.ndarray:
    """Each expert's forecast share of its layer's tokens at each horizon.

    Args:
        counts_TLE: [T, L, E] non-negative counts of the fit window, oldest step first (T >= 1).
        horizons: K >= 1 horizons in steps after the window's last step, each >= 0.
        damping_steps: tau of a damped trend (> 0); None: the straight line.

    Returns:
        shares_KLE: [K, L, E] float64, summing to 1 over E for every layer with tokens (0 where a layer has none).

    Raises:
        ValueError: as `forecast_window`'s, but any number K >= 1 of horizons is allowed.
    """
    counts = np.asarray(counts_TLE, dtype=np.float64)
    horizons_K = np.asarray(horizons, dtype=np.float64).reshape(-1)
    _check(counts, horizons_K, damping_steps, most_horizons=None)
    return _trend_shares(counts, horizons_K, damping_steps)


def _trend_shares(counts_TLE: np.ndarray, horizons_K: np.ndarray, damping_steps: float | None) -> np.ndarray:
    """`trend_shares` on checked arguments (counts_TLE float64)."""
    num_steps = counts_TLE.shape[0]
    totals_TL1 = counts_TLE.sum(axis=2, keepdims=True)
    shares_TLE = _row_shares(counts_TLE)
    # Only rows with tokens carry a share: a step of a layer with no tokens says nothing about its mix.
    weight_TL1 = (totals_TL1 > 0).astype(np.float64)
    mean_LE, slope_LE, t_mean_L1, sxx_L1 = _line(shares_TLE, weight_TL1)
    t_T11 = np.arange(num_steps, dtype=np.float64)[:, None, None]
    residual_TLE = (shares_TLE - mean_LE - slope_LE * (t_T11 - t_mean_L1)) * weight_TL1
    dof_L1 = np.maximum(weight_TL1.sum(axis=0) - 2.0, 1.0)
    se2_LE = np.divide((residual_TLE ** 2).sum(axis=0) / dof_L1, sxx_L1, out=np.full_like(mean_LE, np.inf),
                       where=sxx_L1 > 0)
    signal_LE = np.clip(1.0 - SHRINK * np.divide(se2_LE, slope_LE ** 2, out=np.full_like(mean_LE, np.inf),
                                                  where=slope_LE != 0), 0.0, 1.0)
    slope_LE = slope_LE * signal_LE
    if num_steps >= MIN_STEPS_FOR_HALVES:
        # A trend slopes the same way in both halves of the window; a step (a burst that began or ended within it)
        # leaves both halves flat, their slopes' signs noise: no trend is drawn from it.
        half = num_steps // 2
        first_LE = _line(shares_TLE[:half], weight_TL1[:half])[1]
        second_LE = _line(shares_TLE[half:], weight_TL1[half:])[1]
        same_way_LE = (np.sign(first_LE) == np.sign(slope_LE)) & (np.sign(second_LE) == np.sign(slope_LE))
        slope_LE = np.where(same_way_LE, slope_LE, 0.0)
    end_LE = mean_LE + slope_LE * (num_steps - 1 - t_mean_L1)
    ahead_K = horizons_K if damping_steps is None else damping_steps * (1.0 - np.exp(-horizons_K / damping_steps))
    forecast_KLE = end_LE[None] + slope_LE[None] * ahead_K[:, None, None]
    forecast_KLE = np.maximum(forecast_KLE, FLOOR_OF_MEAN * mean_LE[None])
    total_KL1 = forecast_KLE.sum(axis=2, keepdims=True)
    return np.divide(forecast_KLE, total_KL1, out=np.zeros_like(forecast_KLE), where=total_KL1 > 0)


def _line(shares_TLE: np.ndarray, weight_TL1: np.ndarray) -> tuple[np.ndarray, ...]:
    """The least-squares line through each expert's share over the rows of `shares_TLE` [T, L, E] that
    `weight_TL1` [T, L, 1] (1 or 0) keeps, against the row index t: (mean_LE, slope_LE, t_mean_L1, sxx_L1), the
    line passing through (t_mean, mean) and sxx the sum of squared t - t_mean (0: no slope, which is then 0)."""
    rows_L1 = np.maximum(weight_TL1.sum(axis=0), 1.0)
    t_T11 = np.arange(len(shares_TLE), dtype=np.float64)[:, None, None]
    t_mean_L1 = (weight_TL1 * t_T11).sum(axis=0) / rows_L1
    mean_LE = (weight_TL1 * shares_TLE).sum(axis=0) / rows_L1
    dt_TL1 = (t_T11 - t_mean_L1) * weight_TL1
    sxx_L1 = (dt_TL1 ** 2).sum(axis=0)
    slope_LE = np.divide((dt_TL1 * (shares_TLE - mean_LE)).sum(axis=0), sxx_L1, out=np.zeros_like(mean_LE),
                         where=sxx_L1 > 0)
    return mean_LE, slope_LE, t_mean_L1, sxx_L1


def forecast_window(counts_TLE: np.ndarray, horizons, damping_steps: float | None = None) -> np.ndarray:
    """The fit window with its steps' loads moved to the damped-trend forecast (see the module docstring).

    Args:
        counts_TLE: [T, L, E] non-negative integer counts of the fit window, oldest step first.
        horizons: K >= 1 horizons in steps after the window's last step (>= 0), in the order the window's K chunks
            of rows take them; K at most T (`hedged_horizons` for a placement serving a known period).
        damping_steps: tau of a damped trend (> 0); None: the straight line.

    Returns:
        [T, L, E] int64 counts: row t keeps its total tokens (up to rounding) and chunk k's mean shares are the
        forecast at horizons[k].

    Raises:
        ValueError: a count is negative or not finite, a horizon is negative or not finite, there are more
            horizons than steps or none, or damping_steps is not > 0.
    """
    counts = np.asarray(counts_TLE)
    horizons_K = np.asarray(horizons, dtype=np.float64).reshape(-1)
    _check(counts, horizons_K, damping_steps, most_horizons=counts.shape[0] if counts.ndim == 3 else None)
    num_steps = counts.shape[0]
    values = counts.astype(np.float64)
    shares_KLE = _trend_shares(values, horizons_K, damping_steps)
    out = np.empty_like(values)
    bounds = np.linspace(0, num_steps, len(horizons_K) + 1).round().astype(int)
    for k, (first, stop) in enumerate(zip(bounds[:-1], bounds[1:])):
        out[first:stop] = _rescaled(values[first:stop], shares_KLE[k])
    return np.rint(out).astype(np.int64)


def _rescaled(chunk_TLE: np.ndarray, shares_LE: np.ndarray) -> np.ndarray:
    """The rows of `chunk_TLE` [T, L, E] scaled per expert so that the chunk's shares are `shares_LE` [L, E], each
    row keeping its total: iterative proportional fitting (experts, then rows; `FITTING_ROUNDS` rounds). An expert
    with no tokens in the chunk first gets its expected count in every row."""
    totals_TL1 = chunk_TLE.sum(axis=2, keepdims=True)
    present_LE = chunk_TLE.sum(axis=0) > 0
    rows = np.where(present_LE[None], chunk_TLE, totals_TL1 * shares_LE[None])
    target_LE = shares_LE * totals_TL1.sum(axis=0)
    for _ in range(FITTING_ROUNDS):
        column_LE = rows.sum(axis=0)
        rows = rows * np.divide(target_LE, column_LE, out=np.zeros_like(column_LE), where=column_LE > 0)[None]
        row_TL1 = rows.sum(axis=2, keepdims=True)
        rows = rows * np.divide(totals_TL1, row_TL1, out=np.zeros_like(row_TL1), where=row_TL1 > 0)
    return rows


def hedged_horizons(lag: float, every: float) -> tuple[float, float, float]:
    """The horizons of `forecast_window` for a placement that serves from `lag` to `lag + every` steps after its
    window ends: no change, half-way, and the middle of the served period (h = lag + every / 2)."""
    middle = lag + every / 2.0
    return (0.0, middle / 2.0, middle)


def hedged_window(counts_TLE: np.ndarray, lag: float, every: float) -> np.ndarray:
    """The window a placement that serves from `lag` to `lag + every` steps after it should be fitted on:
    `forecast_window` at `hedged_horizons(lag, every)` where `trend_supported(counts_TLE)`, else the window as it
    is (the same array)."""
    if not trend_supported(counts_TLE):
        return counts_TLE
    return forecast_window(counts_TLE, hedged_horizons(lag, every))


def trend_supported(counts_TLE: np.ndarray) -> bool:
    """Whether the window's own later steps confirm its trend (see the module docstring): at each of
    `HOLDOUT_ORIGINS` origins o in the window's second half, the rows before o forecast the mean share of rows
    [o, T) at their middle, by `trend_shares`, by no change (the rows' mean share) and by the recent level (the mean
    share of the rows' second half); errors are squared share differences summed over layers and experts. True iff
    T >= `MIN_STEPS_FOR_TREND`, the trend's error is below no change's at every origin and its total below the
    recent level's.

    Args:
        counts_TLE: [T, L, E] non-negative counts of the fit window, oldest step first.

    Raises:
        ValueError: as `forecast_window`'s for counts.
    """
    counts = np.asarray(counts_TLE)
    _check(counts, np.zeros(1), None, most_horizons=None)
    num_steps = counts.shape[0]
    if num_steps < MIN_STEPS_FOR_TREND:
        return False
    values = counts.astype(np.float64)
    shares_TLE = _row_shares(values)
    stride = max(1, num_steps // (2 * HOLDOUT_ORIGINS))
    trend_total = recent_total = 0.0
    for k in range(HOLDOUT_ORIGINS):
        origin = num_steps - stride * (HOLDOUT_ORIGINS - k)
        held_LE = _row_shares(values[origin:].sum(axis=0, keepdims=True))[0]
        trend_LE = _trend_shares(values[:origin], np.array([(num_steps - origin + 1) / 2.0]), None)[0]
        still_LE = _mean_share(values[:origin], shares_TLE[:origin])
        recent_LE = _mean_share(values[origin // 2:origin], shares_TLE[origin // 2:origin])
        trend_error = float(((trend_LE - held_LE) ** 2).sum())
        if not trend_error < float(((still_LE - held_LE) ** 2).sum()):
            return False
        trend_total += trend_error
        recent_total += float(((recent_LE - held_LE) ** 2).sum())
    return trend_total < recent_total


def _row_shares(counts_TLE: np.ndarray) -> np.ndarray:
    """[T, L, E] each row's tokens as shares of that row's total (0 in a row without tokens)."""
    totals_TL1 = counts_TLE.sum(axis=2, keepdims=True)
    return np.divide(counts_TLE, totals_TL1, out=np.zeros_like(counts_TLE), where=totals_TL1 > 0)


def _mean_share(counts_TLE: np.ndarray, shares_TLE: np.ndarray) -> np.ndarray:
    """[L, E] the mean of the row shares `shares_TLE` over the rows of `counts_TLE` that carry tokens."""
    rows_TL1 = (counts_TLE.sum(axis=2, keepdims=True) > 0).astype(np.float64)
    return (shares_TLE * rows_TL1).sum(axis=0) / np.maximum(rows_TL1.sum(axis=0), 1.0)


def _check(counts: np.ndarray, horizons_K: np.ndarray, damping_steps: float | None,
           most_horizons: int | None) -> None:
    """ValueError naming the argument that breaks `forecast_window`'s rules (`most_horizons`: the most horizons
    allowed, None for any number)."""
    if counts.ndim != 3 or counts.shape[0] < 1:
        raise ValueError(f"counts_TLE must be [T, L, E] with T >= 1; got shape {counts.shape}")
    if not np.issubdtype(counts.dtype, np.number) or not np.isfinite(counts).all() or (counts < 0).any():
        raise ValueError("counts_TLE must hold finite counts >= 0")
    if horizons_K.size == 0 or (most_horizons is not None and horizons_K.size > most_horizons):
        raise ValueError(f"horizons must hold 1 to T = {counts.shape[0]} values (one per chunk of the window's rows); "
                         f"got {horizons_K.size}")
    if not np.isfinite(horizons_K).all() or (horizons_K < 0).any():
        raise ValueError(f"horizons are steps after the window's end and must be finite and >= 0; got "
                         f"{horizons_K.tolist()}")
    if damping_steps is not None and not (np.isfinite(damping_steps) and damping_steps > 0):
        raise ValueError(f"damping_steps is the damped trend's tau and must be > 0; got {damping_steps}")
