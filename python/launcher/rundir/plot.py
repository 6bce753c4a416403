"""The loss curve of a run as a PNG (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from pathlib import Path


def plot_loss(losses: Sequence[tuple[int, float]], path: Path, title: str) -> bool:
    """Write the loss curve to ``path``; return False when there is nothing to plot."""
    if not losses:
        return False
    import matplotlib as mpl  # noqa: PLC0415 - slow import, only needed at the end of a run

    mpl.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    ax.plot([s for s, _ in losses], [v for _, v in losses], marker="o", linewidth=1.2)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(title, fontsize=9)
    ax.grid(visible=True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def plot_gpus(
    series: Mapping[str, Sequence[tuple[float, float | None, float | None]]], path: Path, title: str
) -> bool:
    """Write each node's GPU utilization (mean) and power (total) over the run to ``path``, beside the loss
    curve (``series``: host -> (seconds since the first sample, util %, power W)); False when no sample."""
    if not any(series.values()):
        return False
    import matplotlib as mpl  # noqa: PLC0415 - slow import, only needed at the end of a run

    mpl.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, (util_ax, power_ax) = plt.subplots(2, 1, figsize=(6, 5), dpi=100, sharex=True)
    for host, points in series.items():
        util = [(t, u) for t, u, _ in points if u is not None]
        power = [(t, p) for t, _, p in points if p is not None]
        util_ax.plot([t for t, _ in util], [u for _, u in util], linewidth=1.2, label=host)
        power_ax.plot([t for t, _ in power], [p for _, p in power], linewidth=1.2, label=host)
    util_ax.set_ylabel("GPU util % (mean)")
    power_ax.set_ylabel("power W (node)")
    power_ax.set_xlabel("seconds")
    util_ax.set_title(title, fontsize=9)
    for ax in (util_ax, power_ax):
        ax.grid(visible=True, alpha=0.3)
    util_ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True
