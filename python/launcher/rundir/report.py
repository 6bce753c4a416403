"""What the commands print about a run: the end-of-run summary and the status block."""

from __future__ import annotations

import time
from typing import IO, TYPE_CHECKING

from launcher.follow.live import render_table
from launcher.follow.telemetry import gpu_lines

if TYPE_CHECKING:
    from launcher.rundir.runs import RunDir, RunRecord


def _num(value: object, spec: str) -> str:
    return format(value, spec) if isinstance(value, int | float) else "-"


def steps_text(record: RunRecord) -> str:
    """Return the steps a run logged, ``5/8``; a run that ended before its first logged step says so."""
    summary = record.summary
    steps, total = summary.get("steps"), summary.get("total_steps")
    if isinstance(steps, int):
        return f"{steps}/{total if isinstance(total, int) else '-'}"
    status = record.status
    if status in ("failed", "stopped"):
        return f"none: {status} before its first step"
    return "none logged"


# how a train_loss that is not the trainer's own was made (metrics.Summary.train_loss_from)
_TRAIN_LOSS_FROM = {"logged": ": the mean of every attempt's logged losses"}


def summary_lines(record: RunRecord, run: RunDir) -> list[str]:
    """Return the summary of a finished run."""
    summary = record.summary
    loss_from = _TRAIN_LOSS_FROM.get(str(summary.get("train_loss_from")), "")
    lines = [
        f"run {record.run_id}: {record.status}"
        + (f" ({record.result_reason})" if record.result_reason else ""),
        f"  nodes       {', '.join(record.hosts)}  (world size {summary.get('world_size') or '-'})",
        f"  steps       {steps_text(record)}",
        f"  final loss  {_num(summary.get('final_loss'), '.4f')}"
        f"  (train_loss {_num(summary.get('train_loss'), '.4f')}{loss_from})",
        f"  runtime     {_num(summary.get('train_runtime'), '.1f')} s"
        f"   tokens/s {_num(summary.get('tokens_per_s'), '.1f')}",
    ]
    lines.extend(attempt_lines(record))
    for host, path in (summary.get("adapter_dirs") or {}).items():
        lines.append(f"  adapter     {host}:{path}")
    lines.extend(f"  note        {note}" for note in summary.get("notes") or [])
    lines.extend(stall_lines(record, run))
    if summary.get("loss_png"):
        lines.append(f"  loss plot   {run.path / 'loss.png'}")
    if summary.get("gpu_png"):
        lines.append(f"  GPU plot    {run.path / 'gpu.png'}")
    lines.append(
        f"  run dir     {run.path}  (node logs in nodes/<host>/trainer.log, each rank's in rank<N>.*.log)"
    )
    return lines


def stall_lines(record: RunRecord, run: RunDir) -> list[str]:
    """Return what the progress watchdog saw of a stalled run: window, lagging nodes, the stack dumps."""
    stall = record.stall
    if stall is None:
        return []
    lagging = ", ".join(stall.get("lagging") or []) or "none named"  # lag_why names the held host/rank
    stacks = sorted(p.relative_to(run.path).as_posix() for p in run.nodes_dir.glob("*/stack-*.txt"))
    return [
        f"  stall       no progress for {_num(stall.get('since_progress_s'), '.0f')} s, window "
        f"{_num(stall.get('window_s'), '.0f')} s ({stall.get('window_why', '-')})",
        f"  lagging     {lagging}: {stall.get('lag_why', '-')}",
        f"  stacks      {len(stacks)} file(s): {', '.join(stacks) if stacks else 'none collected'}",
    ]


def print_summary(run: RunDir, out: IO[str]) -> None:
    """Print the summary of a finished run."""
    out.write("\n".join(summary_lines(run.record(), run)) + "\n")
    out.flush()


def status_lines(record: RunRecord, run: RunDir) -> list[str]:
    """Return the status block of a run: state, timeline and the node table."""
    created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record.created_at))
    lines = [f"run {record.run_id}  {record.status}  created {created}"]
    if record.result_reason:
        lines.append(f"  reason: {record.result_reason}")
    slurm = record.slurm
    if slurm.get("job_id"):
        why = f" ({slurm['reason']})" if slurm.get("reason") else ""
        lines.append(
            f"  slurm: job {slurm['job_id']} {slurm.get('state', '?')}{why} "
            f"(partition {slurm.get('partition', '?')}, login host {slurm.get('login_host', '?')}"
            + (f", run folder {slurm['run_root']})" if slurm.get("run_root") else ")")
        )
    lines.extend(staging_lines(record))
    hosts = list(record.hosts)
    nodes = record.nodes
    if hosts:
        lines.extend("  " + line for line in render_table(hosts, nodes, record.nproc_per_node))
        lines.extend("  " + line for line in gpu_lines(hosts, nodes))
    if not record.summary:  # the summary lists them once the run ended
        lines.extend(attempt_lines(record))
    if record.summary:
        lines.extend(summary_lines(record, run)[1:])
    return lines


def staging_lines(record: RunRecord) -> list[str]:
    """The staging block of a run: progress while it stages, then what the nodes hold and what was sent."""
    from launcher.transfer.manifest import files, human  # noqa: PLC0415
    from launcher.transfer.staging import progress_line  # noqa: PLC0415

    staging = record.staging
    if record.status == "staging" and staging.get("progress"):
        return [f"  staging: {progress_line(staging['progress'])}"]
    lines = [
        f"  staged  {item['key']} {item['digest']} ({files(item['files'])}, {human(item['bytes'])}) "
        f"from {item['kind']} {item['source']} -> {item['dest']}"
        for item in staging.get("items") or []
    ]
    if lines:
        sent = staging.get("sent") or {}
        what = ", ".join(f"{h} {files(s['files'])} {human(s['bytes'])}" for h, s in sent.items()) or "nothing"
        lines.append(f"  staged  sent {what} in {staging.get('seconds', '-')} s")
    return lines


def attempt_lines(record: RunRecord) -> list[str]:
    """Return one line per attempt (for ``status`` and the final report); none for a run of one attempt
    that no failure ended."""
    attempts = record.attempts
    if len(attempts) < 2 and not any(a.get("kind") for a in attempts):
        return []
    lines = []
    for a in attempts:
        start = _clock(a.get("started_at"))
        stop = _clock(a.get("ended_at")) if a.get("ended_at") else "..."
        resume = a.get("resume_step")
        frm = f"from checkpoint-{resume}" if isinstance(resume, int) else "from step 0"
        why = f" {a['kind']}:" if a.get("kind") else ""
        why += f" {a['reason']}" if a.get("reason") else ""
        why += f": {a['cause']}" if a.get("cause") else ""  # the first rank's exception (failure_cause)
        decision = f" -> {a['decision']}" if a.get("decision") else ""
        replaced = a.get("replaced") if isinstance(a.get("replaced"), dict) else None
        spare = "".join(f" ({n} in {o}'s place)" for o, n in (replaced or {}).items())
        nodes = f"{','.join(a.get('hosts') or []) or '-'}{spare}"
        lines.append(
            f"  attempt {a.get('attempt')}  {a.get('state')}  {start}-{stop}  nodes "
            f"{nodes}  {frm}{_plan_words(a.get('plan'))}{why}{decision}"
        )
    return lines


def _plan_words(plan: object) -> str:
    """Return an attempt's plan (``plan: auto``) in words, '' without one."""
    if not isinstance(plan, dict):
        return ""
    margin = plan.get("margin")
    words = (
        f"  [plan {plan.get('strategy')}, micro-batch {plan.get('micro_batch')} x accumulation "
        f"{plan.get('gradient_accumulation_steps')}, checkpointing "
        f"{'on' if plan.get('gradient_checkpointing') else 'off'}, offload {plan.get('offload')}"
    )
    return words + (f", margin {margin:.0%}]" if isinstance(margin, int | float) else "]")


def _clock(t: object) -> str:
    return time.strftime("%H:%M:%S", time.localtime(float(t))) if isinstance(t, int | float) else "?"
