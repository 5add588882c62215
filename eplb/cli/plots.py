"""PNG figures of expert load and GPU imbalance, for people rather than programs.

Shape suffixes: `L` layers, `E` logical experts, `G` GPUs, `T` steps. Imbalance is max over GPUs of the tokens
a GPU processes divided by the mean over GPUs; 1.0 is perfect.

Every function validates its inputs (raising `ValueError` with a one-line message), draws on a
`matplotlib.figure.Figure` (no pyplot global state, so it is safe in servers and threads) and writes the PNG
atomically: `path` ends up with the whole new figure or keeps what it held before.

Colours are the Okabe-Ito palette and ColorBrewer's RdBu, both readable with the common colour-vision deficiencies.
"""

import os

import numpy as np
from matplotlib import colormaps
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, MaxNLocator, MultipleLocator

from traces.atomic_file import write_atomically

__all__ = ["advice_plot", "plot_gpu_loads", "plot_imbalance_over_time", "plot_load_heatmap"]

# Okabe-Ito, most distinct first; yellow left out (it vanishes on white).
_COLOURS = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000"]
_LINESTYLES = ["-", "--", ":", "-."]
_BEFORE, _AFTER = "#D55E00", "#0072B2"
_DPI = 150
_OUTSIDE = dict(loc="upper left", bbox_to_anchor=(1.01, 1.0), framealpha=0.9, fontsize=9)


def _check_array(name: str, value, ndim: int, axes: str) -> np.ndarray:
    """Return `value` as a float64 array with `ndim` dims, non-empty, finite and >= 0, or raise ValueError."""
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: expected a numeric array [{axes}], found {type(value).__name__}") from None
    if arr.ndim != ndim or arr.size == 0:
        raise ValueError(f"{name}: expected a non-empty {ndim}-D array [{axes}], found shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name}: expected finite values, found {int(np.sum(~np.isfinite(arr)))} NaN or inf")
    if np.any(arr < 0):
        raise ValueError(f"{name}: expected values >= 0, found minimum {arr.min():g}")
    return arr


def _imbalance_L(load_LG: np.ndarray) -> np.ndarray:
    """Per layer max / mean over GPUs, [L]; a layer with no tokens counts as perfectly balanced (1.0)."""
    mean_L = load_LG.mean(axis=1)
    max_L = load_LG.max(axis=1)
    return np.divide(max_L, mean_L, out=np.ones_like(mean_L), where=mean_L > 0)


def _save(fig: Figure, path: str | os.PathLike) -> None:
    write_atomically(path, lambda tmp: fig.savefig(tmp, format="png", dpi=_DPI))


def _index_locator(n: int) -> MultipleLocator:
    """Ticks on whole indices, about 16 of them at a round step, for an axis of `n` layers, experts or GPUs."""
    return MultipleLocator(next((s for s in (1, 2, 4, 5, 8, 10, 16, 20, 25, 32, 50, 64, 100) if n <= 16 * s), n // 16))


def _ratio(x: float) -> str:
    """Format a power-of-two ratio for a colour bar: 1/4, 1/2, 1, 2, 4."""
    return f"1/{round(1 / x)}" if x < 1 else f"{round(x)}"


def plot_load_heatmap(load_LE: np.ndarray, path: str | os.PathLike, *, title: str = "Expert load") -> None:
    """Write a heatmap of each expert's load relative to its layer's mean expert.

    Args:
        load_LE: [L, E] float or int, tokens routed to each logical expert (summed or averaged over steps).
        path: where the PNG goes (written atomically).
        title: figure title; the hottest expert is added below it.

    Colour is load / mean load of the layer on a log scale centred at 1.0 (white): red is hot, blue is cold.
    Experts with no tokens are drawn in the deepest blue; a layer with no tokens at all is grey.
    """
    load_LE = _check_array("load_LE", load_LE, 2, "L layers, E experts")
    L, E = load_LE.shape
    mean_L1 = load_LE.mean(axis=1, keepdims=True)
    rel_LE = np.divide(load_LE, mean_L1, out=np.full_like(load_LE, np.nan), where=mean_L1 > 0)

    # Symmetric log range around 1: at least 0.5 .. 2, wide enough for the hottest expert (zeros are clipped).
    hottest = float(np.nanmax(rel_LE)) if np.any(mean_L1 > 0) else 1.0
    hi = 2.0 ** max(1.0, np.ceil(np.log2(max(hottest, 1.0)) * 2) / 2)
    shown_LE = np.ma.masked_invalid(np.clip(rel_LE, 1 / hi, hi))

    fig = Figure(figsize=(min(14.0, 5.0 + 0.05 * E), min(10.0, 3.2 + 0.12 * L)), layout="constrained")
    ax = fig.add_subplot()
    cmap = colormaps["RdBu_r"].with_extremes(bad="#bbbbbb")
    image = ax.imshow(shown_LE, cmap=cmap, norm=LogNorm(1 / hi, hi), aspect="auto", interpolation="nearest")
    ax.set_xlabel("logical expert")
    ax.set_ylabel("MoE layer")
    ax.xaxis.set_major_locator(_index_locator(E))
    ax.yaxis.set_major_locator(_index_locator(L))
    if np.any(mean_L1 > 0):
        layer, expert = np.unravel_index(np.nanargmax(rel_LE), rel_LE.shape)
        sub = f"hottest (circled): layer {layer}, expert {expert} at {hottest:.2f}× its layer's mean"
        ax.plot(expert, layer, marker="o", ms=14, mfc="none", mec="black", mew=1.5)
    else:
        sub = "no tokens in any layer"
    ax.set_title(f"{title}\n{sub}", fontsize=11)

    bar = fig.colorbar(image, ax=ax, fraction=0.04, pad=0.02)
    ticks = [2.0**k for k in range(-int(np.log2(hi)), int(np.log2(hi)) + 1)]
    bar.locator, bar.formatter = FixedLocator(ticks), FuncFormatter(lambda x, _: _ratio(x))
    bar.minorticks_off()
    bar.update_ticks()
    bar.set_label("load / layer mean (log scale)")
    _save(fig, path)


def plot_gpu_loads(
    before_LG: np.ndarray,
    after_LG: np.ndarray,
    path: str | os.PathLike,
    *,
    labels: tuple[str, str] = ("before", "after"),
    title: str = "Per-GPU load",
) -> None:
    """Write per-GPU load before and after a placement: the worst layer's bars, and every layer's imbalance.

    Args:
        before_LG: [L, G] float, tokens per GPU per step (mean over steps) for each layer, before placement.
        after_LG: [L, G] float, the same after placement; same shape as `before_LG`.
        path: where the PNG goes (written atomically).
        labels: legend names of the two loads.
        title: figure title.

    Top panel: the layer with the highest max / mean before, one pair of bars per GPU, the mean as a dashed
    line and each side's max / mean in the legend. Bottom panel: max / mean per layer, before and after.
    """
    before_LG = _check_array("before_LG", before_LG, 2, "L layers, G GPUs")
    after_LG = _check_array("after_LG", after_LG, 2, "L layers, G GPUs")
    if before_LG.shape != after_LG.shape:
        raise ValueError(
            f"before_LG and after_LG: expected the same shape [L, G], found {before_LG.shape} and {after_LG.shape}"
        )
    if len(labels) != 2:
        raise ValueError(f"labels: expected two names (before, after), found {len(labels)}")
    G = before_LG.shape[1]
    imb_before_L, imb_after_L = _imbalance_L(before_LG), _imbalance_L(after_LG)
    worst = int(np.argmax(imb_before_L))

    fig = Figure(figsize=(min(18.0, max(11.0, 6.0 + 0.09 * G)), 7.5), layout="constrained")
    ax_bars, ax_layers = fig.subplots(2, 1, height_ratios=[3, 2])
    fig.suptitle(title, fontsize=13)

    _draw_worst_layer(ax_bars, before_LG[worst], after_LG[worst], worst, labels,
                      (imb_before_L[worst], imb_after_L[worst]))
    _draw_layer_imbalance(ax_layers, imb_before_L, imb_after_L, worst, labels)
    _save(fig, path)


def _draw_worst_layer(ax, before_G: np.ndarray, after_G: np.ndarray, worst: int, labels: tuple[str, str],
                      imbalances: tuple[float, float]) -> None:
    """The top panel of `plot_gpu_loads`: layer `worst`, before and after side by side per GPU, and the means."""
    G = len(before_G)
    x_G = np.arange(G)
    sides = ((before_G, labels[0], _BEFORE, imbalances[0]), (after_G, labels[1], _AFTER, imbalances[1]))
    handles = [
        ax.bar(x_G + (side - 0.5) * 0.4, load_G, width=0.4, color=colour, label=f"{label}: max/mean {imb:.2f}")
        for side, (load_G, label, colour, imb) in enumerate(sides)
    ]
    means = (before_G.mean(), after_G.mean())
    if np.isclose(means[0], means[1], rtol=1e-6):
        handles.append(ax.axhline(means[0], color="black", ls="--", lw=1.2, label=f"mean: {means[0]:.4g} tokens"))
    else:
        for mean, label, colour in zip(means, labels, (_BEFORE, _AFTER)):
            line = ax.axhline(mean, color=colour, ls="--", lw=1.2, label=f"{label} mean: {mean:.4g} tokens")
            handles.append(line)
    ax.set_title(f"layer {worst}, where {labels[0]} is most imbalanced", fontsize=11)
    ax.set_xlabel("GPU (rank)")
    ax.set_ylabel("tokens per step")
    ax.set_xlim(-0.75, G - 0.25)
    if before_G.max() > 0 or after_G.max() > 0:
        ax.set_ylim(bottom=0)
    # Every GPU when few, else every node of 8 (the default gpus_per_node).
    ax.xaxis.set_major_locator(MultipleLocator(1 if G <= 16 else 8 * int(np.ceil(G / 128))))
    ax.legend(handles=handles, **_OUTSIDE)  # bars first, then mean lines


def _draw_layer_imbalance(ax, imb_before_L: np.ndarray, imb_after_L: np.ndarray, worst: int,
                          labels: tuple[str, str]) -> None:
    """The bottom panel of `plot_gpu_loads`: every layer's imbalance before and after, layer `worst` marked."""
    L = len(imb_before_L)
    x_L = np.arange(L)
    marker = "o" if L <= 80 else None
    for imb_L, label, colour in ((imb_before_L, labels[0], _BEFORE), (imb_after_L, labels[1], _AFTER)):
        ax.plot(x_L, imb_L, color=colour, marker=marker, ms=3.5, lw=1.5,
                label=f"{label}: mean {imb_L.mean():.3f}, worst {imb_L.max():.3f}")
    ax.axhline(1.0, color="grey", lw=1, ls=":", label="perfect (1.0)")
    ax.axvline(worst, color="grey", lw=0.8, alpha=0.5, label=f"layer {worst}, shown above")
    ax.set_xlabel("MoE layer")
    ax.set_ylabel("max / mean GPU load")
    ax.set_title("imbalance per layer", fontsize=11)
    ax.set_xlim(-0.5, L - 0.5)
    ax.xaxis.set_major_locator(_index_locator(L))
    ax.grid(axis="y", alpha=0.3)
    ax.legend(**_OUTSIDE)


def _running_mean(y_T: np.ndarray, window: int) -> np.ndarray:
    """Centred running mean over `window` steps, [T]; the window shrinks at the ends instead of padding."""
    kernel = np.ones(window)
    return np.convolve(y_T, kernel, mode="same") / np.convolve(np.ones_like(y_T), kernel, mode="same")


def plot_imbalance_over_time(
    series: dict[str, np.ndarray],
    path: str | os.PathLike,
    *,
    refit_steps: list[int] | None = None,
    lower_bound_T: np.ndarray | None = None,
    title: str = "Imbalance over time",
) -> None:
    """Write one line per policy or routing of imbalance against step.

    Args:
        series: name -> [T] float, imbalance per step (already averaged over layers; 1.0 = perfect).
            Series may have different lengths; x is the step index.
        path: where the PNG goes (written atomically).
        refit_steps: steps at which the placement was re-fitted, drawn as faint vertical lines.
        lower_bound_T: [T] float, a lower bound on imbalance per step, drawn dashed grey.
        title: figure title.

    Series longer than 60 steps are drawn raw (faint) with a running mean over about 2% of the steps (bold).
    """
    if not isinstance(series, dict) or not series:
        raise ValueError(f"series: expected a non-empty dict name -> [T] array, found {type(series).__name__} "
                         f"of length {len(series) if hasattr(series, '__len__') else 'n/a'}")
    checked = {str(name): _check_array(f"series[{name!r}]", y, 1, "T steps") for name, y in series.items()}
    bound_T = None if lower_bound_T is None else _check_array("lower_bound_T", lower_bound_T, 1, "T steps")
    steps = [] if refit_steps is None else [int(s) for s in refit_steps]
    if any(s < 0 for s in steps):
        raise ValueError(f"refit_steps: expected step indices >= 0, found {min(steps)}")
    T = max(max(len(y) for y in checked.values()), 0 if bound_T is None else len(bound_T))

    fig = Figure(figsize=(11.0, 5.0), layout="constrained")
    ax = fig.add_subplot()
    window = max(5, T // 50)
    _draw_series(ax, checked, window)
    if bound_T is not None:
        ax.plot(np.arange(len(bound_T)), bound_T, color="dimgrey", ls="--", lw=1.5,
                label=f"lower bound: mean {bound_T.mean():.3f}")
    for j, step in enumerate(steps):
        ax.axvline(step, color="grey", lw=0.8, alpha=0.5, zorder=0, label="placement re-fitted" if j == 0 else None)
    ax.axhline(1.0, color="black", lw=0.9, ls=":", label="perfect (1.0)")
    if T > 60:
        title += f"  (bold: running mean over {window} steps)"
        _clip_spikes(ax, checked, bound_T)
    ax.set_title(title, fontsize=12)
    ax.set_xlabel("decode step")
    ax.set_ylabel("max / mean GPU load")
    ax.set_xlim(0, max(T - 1, 1))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(axis="y", alpha=0.3)
    ax.legend(**_OUTSIDE)
    _save(fig, path)


def _draw_series(ax, checked: dict[str, np.ndarray], window: int) -> None:
    """One line per series [T]: raw (faint) with a running mean over `window` steps (bold) when longer than 60
    steps, else raw with markers."""
    for i, (name, y_T) in enumerate(checked.items()):
        colour, ls = _COLOURS[i % len(_COLOURS)], _LINESTYLES[(i // len(_COLOURS)) % len(_LINESTYLES)]
        x_T = np.arange(len(y_T))
        label = f"{name}: mean {y_T.mean():.3f}, p99 {np.percentile(y_T, 99):.3f}"
        if len(y_T) > 60:
            ax.plot(x_T, y_T, color=colour, lw=0.6, alpha=0.2)
            ax.plot(x_T, _running_mean(y_T, window), color=colour, lw=2.2, ls=ls, label=label)
        else:
            ax.plot(x_T, y_T, color=colour, lw=2.0, ls=ls, marker="o", ms=3, label=label)


def _clip_spikes(ax, checked: dict[str, np.ndarray], bound_T: np.ndarray | None) -> None:
    """Rare spikes would flatten the lines people compare: cut the y axis at the 99.5th percentile and say so."""
    raw = np.concatenate(list(checked.values()))
    top = max(np.percentile(raw, 99.5), 1.0 if bound_T is None else bound_T.max())
    bottom = min(1.0, raw.min(), np.inf if bound_T is None else bound_T.min())
    if raw.max() > top:
        ax.set_ylim(bottom - 0.03 * (top - bottom), top + 0.05 * (top - bottom))
        ax.text(0.99, 0.98, f"{int(np.sum(raw > top))} step values above the top edge (max {raw.max():.2f})",
                transform=ax.transAxes, ha="right", va="top", fontsize=8, color="dimgrey",
                bbox=dict(facecolor="white", edgecolor="none", alpha=0.8))


def advice_plot(rows: list[dict], path: str | os.PathLike, title: str) -> None:
    """`eplb advise`'s figure: decode tokens/s per GPU (left) and the expert imbalance at that batch (right)
    against redundant experts, one line per EP size (cpsat solid, DeepSeek's greedy dashed), its rows with node
    limits a fainter line of squares beside it; rows whose weights do not fit are left out."""
    if not rows:
        raise ValueError("rows: expected at least one candidate row, found none")
    fig = Figure(figsize=(11, 4.2))
    rate_ax, imbalance_ax = fig.subplots(1, 2)
    for index, cards in enumerate(sorted({row["cards"] for row in rows})):
        colour = _COLOURS[index % len(_COLOURS)]
        for limited, marker, named in ((False, "o", ""), (True, "s", ", node limits")):
            mine = sorted((row for row in rows if row["cards"] == cards and row.get("node_limits", False) == limited
                           and row["cpsat"]["tokens_per_s_per_card"] > 0), key=lambda row: row["redundant_experts"])
            if not mine:
                continue
            redundant = [row["redundant_experts"] for row in mine]
            for policy, style, label in (("cpsat", "-", f"EP{cards}{named}"), ("deepseek", "--", None)):
                style = ":" if limited and policy == "deepseek" else style
                rate_ax.plot(redundant, [row[policy]["tokens_per_s_per_card"] for row in mine], style,
                             marker=marker, color=colour, label=label, alpha=0.6 if limited else 1.0)
                imbalance_ax.plot(redundant, [row[policy]["imbalance"] for row in mine], style, marker=marker,
                                  color=colour, alpha=0.6 if limited else 1.0)
    rate_ax.set_xlabel("redundant experts")
    rate_ax.set_ylabel("decode tokens/s per GPU")
    rate_ax.set_title("throughput (solid: cpsat, dashed: greedy; squares: node limits)", fontsize=10)
    imbalance_ax.set_xlabel("redundant experts")
    imbalance_ax.set_ylabel("expert imbalance at the batch (max / mean)")
    imbalance_ax.set_title("imbalance", fontsize=10)
    for ax in (rate_ax, imbalance_ax):
        ax.grid(alpha=0.3)
    rate_ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    _save(fig, path)
