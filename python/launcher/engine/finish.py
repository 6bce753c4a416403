"""Finish: the one sequence that ends a run, used by ``run``, ``status`` (a run nobody follows) and ``stop``.

Stop the trainer everywhere unless it succeeded (or was stopped already), collect logs and metrics (and give
the GPU lease back), record the final state, print the summary.
"""

from __future__ import annotations

from typing import IO, TYPE_CHECKING

from launcher.node import contract
from launcher.rundir.report import print_summary

if TYPE_CHECKING:
    from launcher.engine.job import Job
    from launcher.follow.verdict import Verdict
    from launcher.rundir.metrics import Summary


def finish(
    job: Job,
    verdict: Verdict,
    nodes: dict[str, contract.NodeStatus] | None = None,
    *,
    out: IO[str] | None = None,
    stopped: bool = False,
    announce: bool = False,
) -> Summary:
    """End the run with ``verdict``: stop every node unless it succeeded (with every trainer ended: see
    ``Verdict.stop_lingering``) or ``stopped``, then finalize.

    Args:
        job: the run's nodes.
        verdict: the final state and why.
        nodes: the last node states (from the follow loop or a status poll).
        out: where the summary is printed (None: not printed).
        stopped: the caller already stopped every node (``stop``).
        announce: print ``STATE: reason; stopping every node ...`` before stopping (``run``).
    """
    if (verdict.state != "succeeded" or verdict.stop_lingering) and not stopped:
        if announce and out is not None:
            print(f"{verdict.state}: {verdict.reason}; stopping every node ...", file=out, flush=True)
        job.run.set_status("stopping", verdict.reason)
        job.dump_stacks_on_stop = verdict.state == "stalled"
        job.stop()
    # finalize's collect also gives the GPU lease back: the GPUs are free for the next run
    summary = job.finalize(verdict.state, verdict.reason, nodes)
    if out is not None:
        print_summary(job.run, out)
    return summary
