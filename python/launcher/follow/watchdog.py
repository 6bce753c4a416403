"""The progress watchdog: a run whose optimizer step does not advance within a window is stalled.

Pure decisions, no I/O (the follow loop feeds them each poll's node states; the node agent reports what it
sees on its node, ``launcher/node/watch.py`` ``watch_facts``):

* **window** (:meth:`ProgressWatch.window`): before the first step, ``first_step_s`` (model load, data
  preparation, compilation). From the first step on, ``max(k x p95 of the intervals between the steps seen,
  floor_s)``; until ``MIN_INTERVALS`` interval is measured, the trainer's own ``elapsed_time / step`` at the
  first step seen stands for the p95 (it holds the first step's cost: on the safe side), and without it
  ``first_step_s`` still applies. After a step that the training
  YAML says is followed by a checkpoint save (``save_steps``, and the last step: the final save) the window
  grows by ``save_s``, after an evaluation step (``eval_steps`` with evaluation on) by ``eval_s``; a
  checkpoint a node reports incomplete (a ``checkpoint-N`` without ``trainer_state.json``) counts as a save
  in progress too.
* **progress** (:meth:`ProgressWatch.observe`): the highest step any node logged went up, or a node's newest
  checkpoint folder was written to (a slow save that writes resets the clock; a save stuck before it writes
  anything is covered by ``save_s``). Only step changes are measured as step intervals, and not those that
  held a save or an evaluation (scheduled, or a checkpoint seen written).
* **who lags** (:func:`lagging`): the nodes with the lowest step; when every node is at the same step (ranks
  in lock step all wait in the same collective), the nodes with a trainer process stopped (state T) or in
  uninterruptible sleep (D); else none is named. The ranks (``host/rankN``, :func:`held_ranks`) are those
  held on the lagging nodes (a node runs ``nproc_per_node`` ranks; the step is logged per node).

The defaults (:class:`WatchdogOptions`, job spec key ``watchdog``) need no tuning: 5 x p95, at least 5 minutes
between steps, 30 minutes for the first step, a save or an evaluation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from launcher.node import contract

# step intervals measured before k x p95 is used (until then: first_step_s); one is enough: k and floor_s give
# the margin, and the controller sees steps only at its polls (a run of 3 steps may show it just 2)
MIN_INTERVALS = 1
# process states that name a rank as the one that holds the others up (ps(1): T stopped, t traced, D
# uninterruptible sleep)
HOLDING_STATES = {"T": "stopped", "t": "stopped by a tracer", "D": "in uninterruptible sleep"}


# PyTorch's flight recorder, on for every GPU run (ProcessGroupNCCL; RCCL on ROCm): the last collectives of
# each rank, dumped when a collective times out (ddp_timeout) and, on a stall, through the dump pipe the node
# agent writes to (the agent points TORCH_NCCL_DEBUG_INFO_TEMP_FILE and _PIPE_FILE into the node run
# directory); the job spec's env wins
FLIGHT_RECORDER_ENV = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}


def with_flight_recorder(env: Mapping[str, str], *, gpu: bool) -> dict[str, str]:
    """Return a GPU node's trainer environment with the flight recorder on (a CPU node's as it is)."""
    return {**FLIGHT_RECORDER_ENV, **env} if gpu else dict(env)


class WatchdogOptions(BaseModel):
    """Job spec ``watchdog``: when a run without a new optimizer step counts as stalled (the one place of the
    defaults)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    k: Annotated[float, Field(ge=1.0, le=100.0)] = 5.0  # window = k x p95 of the step intervals ...
    floor_s: Annotated[float, Field(ge=1.0)] = 300.0  # ... and never below this
    first_step_s: Annotated[float, Field(ge=1.0)] = 1800.0  # until the first steps: start-up, data, compile
    save_s: Annotated[float, Field(ge=0.0)] = 1800.0  # added after a step followed by a checkpoint save
    eval_s: Annotated[float, Field(ge=0.0)] = 1800.0  # added after a step followed by an evaluation


def p95(values: Sequence[float]) -> float:
    """Return the 95th percentile of ``values`` (nearest rank; 0 for none)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def _positive_int(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        number = int(float(value))
    except ValueError:
        return None
    return number if number > 0 else None


@dataclass(frozen=True)
class Schedule:
    """When the trainer does more than a step: checkpoint saves and evaluations (from the training YAML)."""

    save_steps: int | None = None
    eval_steps: int | None = None
    max_steps: int | None = None

    @classmethod
    def from_training(cls, train: Mapping[str, Any]) -> Schedule:
        """Read the schedule from the shipped training YAML (HF TrainingArguments' keys and defaults:
        ``save_strategy`` steps with ``save_steps`` 500; evaluation only with ``eval_strategy`` steps,
        ``eval_steps`` defaulting to ``logging_steps``)."""
        save = None
        if str(train.get("save_strategy", "steps")).lower() == "steps":
            save = _positive_int(train.get("save_steps", 500))
        strategy = str(train.get("eval_strategy", train.get("evaluation_strategy", "no"))).lower()
        evals = None
        if strategy == "steps":
            evals = _positive_int(train.get("eval_steps")) or _positive_int(train.get("logging_steps", 500))
        return cls(save_steps=save, eval_steps=evals, max_steps=_positive_int(train.get("max_steps")))

    def after(self, step: int, total: int | None) -> list[str]:
        """Return what follows ``step`` besides the next step: ``save`` and/or ``eval``."""
        last = total or self.max_steps
        extra = []
        if (self.save_steps and step % self.save_steps == 0) or (last and step >= last):
            extra.append("save")
        if self.eval_steps and step % self.eval_steps == 0:
            extra.append("eval")
        return extra


@dataclass(frozen=True)
class Window:
    """How long the run may go without progress now, and why that long."""

    seconds: float
    why: str


@dataclass(frozen=True)
class Stall:
    """A run without progress for longer than its window."""

    seconds: float  # since the last progress
    window: Window
    step: int | None
    lagging: tuple[str, ...]
    lag_why: str
    ranks: tuple[str, ...] = ()  # host/rankN held (stopped, uninterruptible) on the lagging nodes

    @property
    def reason(self) -> str:
        """One line: how long, the window, who lags."""
        at = f"after step {self.step}" if self.step is not None else "before the first step"
        who = f"; lagging: {self.lag_why}" if self.lagging else f"; {self.lag_why}"
        return (
            f"no progress for {self.seconds:.0f} s {at} (window {self.window.seconds:.0f} s: "
            f"{self.window.why}){who}"
        )

    def as_dict(self) -> dict[str, Any]:
        """Return the stall for the run record."""
        return {
            "since_progress_s": round(self.seconds, 1),
            "window_s": round(self.window.seconds, 1),
            "window_why": self.window.why,
            "step": self.step,
            "lagging": list(self.lagging),
            "lagging_ranks": list(self.ranks),
            "lag_why": self.lag_why,
        }


def node_step(node: contract.NodeStatus) -> int | None:
    """Return the last optimizer step a node logged (None: none yet, or the node logs none)."""
    last = node.get("last_log") or {}
    step = last.get("current_steps") if isinstance(last, dict) else None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def _total(nodes: Mapping[str, contract.NodeStatus]) -> int | None:
    for node in nodes.values():
        last = node.get("last_log") or {}
        total = last.get("total_steps") if isinstance(last, dict) else None
        if isinstance(total, int) and not isinstance(total, bool) and total > 0:
            return total
    return None


def elapsed_seconds(text: object) -> float | None:
    """Return LLaMA-Factory's ``elapsed_time`` (a ``str(timedelta)``: "0:01:05", "1 day, 0:00:05") in s."""
    if not isinstance(text, str):
        return None
    days, _, clock = text.rpartition(", ")
    parts = clock.split(":")
    if len(parts) != 3:
        return None
    try:
        seconds = sum(float(v) * 60.0**i for i, v in enumerate(reversed(parts)))
        extra = float(days.split()[0]) * 86400 if days else 0.0
    except (ValueError, IndexError):
        return None
    return seconds + extra


def _seconds_per_step(nodes: Mapping[str, contract.NodeStatus], step: int) -> float | None:
    """Return the slowest node's elapsed_time / step at ``step`` (None: no node says)."""
    rates = []
    for node in nodes.values():
        last = node.get("last_log") or {}
        elapsed = elapsed_seconds(last.get("elapsed_time")) if isinstance(last, dict) else None
        if elapsed is not None and node_step(node) == step and step > 0:
            rates.append(elapsed / step)
    return max(rates) if rates else None


def _watch(node: contract.NodeStatus) -> Mapping[str, Any]:
    watch = node.get("watch")
    return watch if isinstance(watch, dict) else {}


def _checkpoint_marks(nodes: Mapping[str, contract.NodeStatus]) -> tuple[tuple[str, object, object], ...]:
    """Return per node (host, newest checkpoint step, its newest write) as the agents report them."""
    marks = []
    for host, node in sorted(nodes.items()):
        ckpt = _watch(node).get("checkpoint")
        if isinstance(ckpt, dict):
            marks.append((host, ckpt.get("step"), ckpt.get("mtime")))
    return tuple(marks)


def _saving(nodes: Mapping[str, contract.NodeStatus]) -> list[str]:
    """Return the nodes whose newest checkpoint is being written (no trainer_state.json yet)."""
    saving = []
    for host, node in sorted(nodes.items()):
        ckpt = _watch(node).get("checkpoint")
        if isinstance(ckpt, dict) and ckpt.get("complete") is False:
            saving.append(host)
    return saving


def rank_label(host: str, rank: object) -> str:
    """Return how reports name one trainer rank: ``host/rankN`` (N: the global rank)."""
    return f"{host}/rank{rank}"


def held_ranks(hosts: Sequence[str], nodes: Mapping[str, contract.NodeStatus]) -> dict[str, dict[str, str]]:
    """Return host -> {``host/rankN``: one line} for the ranks stopped or in uninterruptible sleep
    (``watch.ranks[]`` from the agent: global rank, local rank, pid, process state)."""
    held: dict[str, dict[str, str]] = {}
    for host in hosts:
        for rank in _watch(nodes.get(host, {})).get("ranks") or []:
            state = str(rank.get("state", "")) if isinstance(rank, dict) else ""
            if state in HOLDING_STATES:
                local, number = rank.get("local_rank"), rank.get("rank", "?")
                what = f"{host}/rank {number} (pid {rank.get('pid', '?')}) {HOLDING_STATES[state]}"
                if local not in (None, ""):
                    what += f" (local rank {local})"
                held.setdefault(host, {})[rank_label(host, number)] = what
    return held


def lagging(hosts: Sequence[str], nodes: Mapping[str, contract.NodeStatus]) -> tuple[tuple[str, ...], str]:
    """Return the nodes that hold the run up, and why (no node: empty, and what was seen).

    The lowest step first; with every node at the same step, the nodes with a trainer rank stopped or in
    uninterruptible sleep (``watch.ranks[].state`` from the agent).
    """
    steps = {h: node_step(nodes.get(h, {})) for h in hosts}
    known = {h: s for h, s in steps.items() if s is not None}
    if len(set(known.values())) > 1:  # a node that logs no step (only the first node logs) is not behind
        low = min(known.values())
        behind = tuple(h for h in hosts if known.get(h) == low)
        ahead = max(known.values())
        return behind, ", ".join(f"{h} at step {low}" for h in behind) + f" (others at step {ahead})"
    held = {h: list(lines.values()) for h, lines in held_ranks(hosts, nodes).items()}
    if held:
        return tuple(held), "; ".join(line for lines in held.values() for line in lines) + (
            f", every node at step {next(iter(known.values()))}" if known else ""
        )
    at = f"every node at step {next(iter(known.values()))}" if known else "no node logged a step"
    return (), f"no node lags by its step count ({at}); see the stack dumps"


@dataclass
class ProgressWatch:
    """The watchdog's memory over the follow loop's polls (times: the controller's monotonic clock)."""

    options: WatchdogOptions
    schedule: Schedule
    hosts: Sequence[str]
    started: float
    step: int | None = None
    step_seen: float | None = None
    last_progress: float = 0.0
    intervals: list[float] = field(default_factory=list)
    marks: tuple[tuple[str, object, object], ...] = ()
    paused: bool = False  # a save was seen since the last step: the next interval is not measured
    # seconds per step by the trainer's own clock (elapsed_time / current_steps of the first step seen): the
    # step time until the controller has measured an interval itself (its polls may first see step 7)
    estimate: float | None = None

    def __post_init__(self) -> None:
        self.last_progress = self.started

    def restart(self, now: float) -> None:
        """Begin again at ``now``: the trainers start over (a Slurm job in the queue, or restarted from a
        checkpoint below the last step seen), so the first-step window applies; measured intervals are
        kept."""
        self.step = self.step_seen = self.estimate = None
        self.marks = ()
        self.paused = False
        self.last_progress = now

    def window(self, total: int | None = None, saving: Sequence[str] = ()) -> Window:
        """Return the window that applies after the last progress seen."""
        opts = self.options
        if self.step is None:
            return Window(opts.first_step_s, "first step (first_step_s)")
        if len(self.intervals) < MIN_INTERVALS and self.estimate is not None:
            q = (
                self.estimate
            )  # the trainer's own clock: elapsed_time / steps (the first step's cost included)
            base = Window(
                max(opts.k * q, opts.floor_s),
                f"max({opts.k:g} x {q:.1f} s (the trainer's elapsed_time / step {self.step}), floor_s "
                f"{opts.floor_s:g})",
            )
        elif len(self.intervals) < MIN_INTERVALS:
            base = Window(opts.first_step_s, f"first_step_s until {MIN_INTERVALS} step interval is measured")
        else:
            q = p95(self.intervals)
            if opts.k * q >= opts.floor_s:
                base = Window(
                    opts.k * q, f"{opts.k:g} x p95 {q:.1f} s of {len(self.intervals)} step intervals"
                )
            else:
                base = Window(
                    opts.floor_s,
                    f"floor_s; {opts.k:g} x p95 {q:.1f} s of {len(self.intervals)} step intervals is less",
                )
        extra = self.schedule.after(self.step, total)
        if saving and "save" not in extra:
            extra.append("save")
        seconds, why = base.seconds, base.why
        if "save" in extra:
            seconds += opts.save_s
            why += f" + save_s {opts.save_s:g} (checkpoint save after step {self.step})"
        if "eval" in extra:
            seconds += opts.eval_s
            why += f" + eval_s {opts.eval_s:g} (evaluation after step {self.step})"
        return Window(seconds, why)

    def observe(self, nodes: Mapping[str, contract.NodeStatus], now: float) -> Stall | None:
        """Take one poll's node states; return the stall when the run has gone longer than its window."""
        steps = [s for s in (node_step(nodes.get(h, {})) for h in self.hosts) if s is not None]
        top = max(steps) if steps else None
        total, saving = _total(nodes), _saving(nodes)
        marks = _checkpoint_marks(nodes)
        if marks != self.marks:
            if self.marks:  # the first report is where the clock starts, not progress
                self.last_progress = max(self.last_progress, now)
                self.paused = True
            self.marks = marks
        if saving:
            self.paused = True
        if top is not None and (self.step is None or top > self.step):
            # an interval that held a save or an evaluation is no step interval: it would raise k x p95
            held = self.paused or (self.step is not None and self.schedule.after(self.step, total))
            if self.step is not None and self.step_seen is not None and not held:
                self.intervals.append(now - self.step_seen)
            if self.step is None:
                self.estimate = _seconds_per_step(nodes, top)
            self.step, self.step_seen, self.last_progress = top, now, now
            self.paused = bool(saving)
        window = self.window(total, saving)
        quiet = now - self.last_progress
        if not self.options.enabled or quiet <= window.seconds:
            return None
        who, why = lagging(self.hosts, nodes)
        holding = held_ranks(who, nodes)
        ranks = tuple(label for host in who for label in holding.get(host, {}))
        lines = [line for by_host in holding.values() for line in by_host.values()]
        if lines and lines[0] not in why:  # named by its step: say which of its ranks holds it up too
            why += "; " + "; ".join(lines)
        return Stall(quiet, window, self.step, who, why, ranks)
