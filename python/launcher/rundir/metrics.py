"""Training metrics from LLaMA-Factory's ``trainer_log.jsonl`` and ``all_results.json``."""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathlib import Path


@dataclass
class Summary:
    """The numbers printed at the end of a run."""

    steps: int | None = None
    total_steps: int | None = None
    final_loss: float | None = None
    train_loss: float | None = None
    # "trainer": all_results.json's; "logged": the mean of the logged losses (a resumed run, where the
    # trainer's own divides the last attempt's losses by every step)
    train_loss_from: str | None = None
    train_runtime: float | None = None
    tokens_per_s: float | None = None
    samples_per_s: float | None = None
    losses: list[tuple[int, float]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """Return the summary without the loss series."""
        return {k: v for k, v in self.__dict__.items() if k != "losses"}


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Return the JSON objects of a JSON-lines file (bad lines skipped; missing file: empty)."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict):
            out.append(entry)
    return out


def _num(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def summarize(trainer_log: list[dict[str, Any]], results: dict[str, Any]) -> Summary:
    """Return the run summary from the trainer log entries and ``all_results.json``."""
    summary = Summary()
    for entry in trainer_log:
        step, loss = entry.get("current_steps"), _num(entry.get("loss"))
        if isinstance(step, int) and loss is not None:
            summary.losses.append((step, loss))
        if isinstance(step, int):
            summary.steps = step
        if isinstance(entry.get("total_steps"), int):
            summary.total_steps = entry["total_steps"]
        if _num(entry.get("throughput")) is not None:
            summary.tokens_per_s = _num(entry.get("throughput"))
    logged = [step for step, _ in summary.losses]
    # a resumed attempt logs again the steps after its checkpoint: the last value logged for a step counts
    summary.losses = sorted(dict(summary.losses).items())
    if summary.losses:
        summary.final_loss = summary.losses[-1][1]
    summary.train_loss = _num(results.get("train_loss"))
    summary.train_loss_from = "trainer" if summary.train_loss is not None else None
    if any(later <= earlier for earlier, later in itertools.pairwise(logged)):
        summary.train_loss, summary.train_loss_from = _whole_run_mean(summary.losses)
    summary.train_runtime = _num(results.get("train_runtime"))
    summary.samples_per_s = _num(results.get("train_samples_per_second"))
    if summary.tokens_per_s is None:
        summary.tokens_per_s = _num(results.get("train_tokens_per_second"))
    return summary


def _whole_run_mean(losses: list[tuple[int, float]]) -> tuple[float | None, str | None]:
    """The train loss of a resumed run: transformers' ``train_loss`` sums only the last attempt's step losses
    and divides them by every step (a run resumed at step 10 of 40 reports about 3/4 of its loss), so it is
    the mean of the logged losses instead, when they cover the run from its first logged step; else none."""
    steps = [step for step, _ in losses]
    interval = steps[1] - steps[0] if len(steps) > 1 else steps[0]
    gaps = {later - earlier for earlier, later in itertools.pairwise(steps)}
    if steps[0] > interval or gaps - {interval}:
        return None, None
    return sum(loss for _, loss in losses) / len(losses), "logged"


def write_metrics(trainer_log: list[dict[str, Any]], path: Path) -> None:
    """Write the trainer log entries as the run's ``metrics.jsonl``."""
    with path.open("w") as fh:
        for entry in trainer_log:
            fh.write(json.dumps(entry) + "\n")
