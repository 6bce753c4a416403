"""The loss curve of a run as a PNG (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence
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
