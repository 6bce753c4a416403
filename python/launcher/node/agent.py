#!/usr/bin/env python3
"""Node agent of the launcher (the supervisor side): start, report on and stop one trainer in a node run
directory.

Standard library only: part of the node program (``launcher/node``, one zipapp); the launch playbook's install
copies that file into ``/var/lib/mift/runs/<run_id>/mift_node.pyz``, and the playbooks run ``python3
mift_node.pyz agent COMMAND ...`` with the system ``python3``. Each command's code is in a module of its own
(``supervise``, ``bundle``, ``status``, ``stop``, ``collect``, ``slurm``, ``shared``). The run directory
holds, unpacked by ``start`` from the ``bundle.json`` the launch playbook copied:

* ``job.json``  -- ``mift_contract.Job`` (no secrets)
* ``env.json``  -- the trainer's extra environment, mode 0600 (may hold secrets)
* the files of the run plan (``train.yaml``, ``ds_config.json``), mode 0600

and, written by this agent:

* ``trainer.pid`` -- the trainer's pid (= its process group id)
* ``trainer.log`` -- stdout and stderr of the trainer; torchrun tees every rank's lines into it, each line
  prefixed ``[rankN localL]:`` (N: the global rank, L: the local rank)
* ``ranks/`` -- torchrun's log folder: each local rank's ``stdout.log`` and ``stderr.log``; ``collect``
  ships them as ``rank<N>.stdout.log`` and ``rank<N>.stderr.log``
* ``state.json``  -- ``{"state", "pid", "supervisor_pid", "supervisor_id", "started_at", "ended_at", "rc"}``
  (``supervisor_id``: boot id and start time of the supervisor, so that a later process given its pid is
  not taken for it)
* ``rc``          -- the trainer's exit status once it ended
* ``stop_requested`` -- present once ``stop`` was asked for
* ``telemetry.jsonl``, ``telemetry.json``, ``gpu_after.json`` -- GPU samples while the trainer runs (every
  ``telemetry_period_s`` of job.json, from a baseline taken before it starts) and the check after the run,
  written by ``mift_gpu.py`` (shipped next to this file); a GPU that breaks stops the trainer (state
  ``failed``, ``gpu_fault``)

Commands (each prints one JSON object on stdout):

* ``start RUN_DIR``  -- double-fork a supervisor that runs the trainer in its own session and process group,
  wait until the trainer is running, return. The supervisor survives the ssh session and records the exit
  status.
* ``prepare RUN_DIR`` -- unpack the bundle and record the run as ``queued``; start nothing (the Slurm backend:
  Slurm starts the trainer later, through ``slurm-step``).
* ``slurm-step RUN_DIR [--grace S]`` -- run by ``srun``, one task per node: take ``NODE_RANK`` from
  ``SLURM_NODEID``, ``NNODES`` and ``MASTER_ADDR`` from the allocation, then supervise the trainer in the
  foreground (the same supervisor and files as ``start``); exit non-zero when the trainer did, so that
  ``srun --kill-on-bad-exit`` ends the job. SIGTERM (scancel, a time limit, another node's failure) stops the
  trainer and records the run as stopped.
* ``slurm-check ROOT`` -- login host only (docs/slurm.md): the first step of the batch script, one task per
  node, before any trainer: this node can run rank ``SLURM_NODEID`` of the job (ROOT/rank<N>: the trainer,
  the stack versions the job was planned for, GPUs verified, free disk); a node that cannot records why as
  its rank's state and exits 1, which fails the job.
* ``slurm-step ROOT --ranks`` -- as ``slurm-step``, in ROOT/rank<SLURM_NODEID> (a shared run root).
* ``slurm-step RUN_DIR --restart K --resume-step N|none`` -- restart K of a requeued job (docs/slurm.md
  "Requeue"): the trainer resumes from ``checkpoint-N`` of its output_dir (LLaMA-Factory's command-line
  overrides ``resume_from_checkpoint=...``), or starts as the first attempt did (``none``); the state file
  records the restart and the step.
* ``slurm-checkpoints RUN_DIR`` -- one JSON line: this node's Slurm name and its complete ``checkpoint-N``
  steps (the batch script runs it on every node when Slurm restarts the job).
* ``resume-step RUN_DIR --nodes N`` -- read the lines of ``slurm-checkpoints`` from every node on stdin and
  print the newest step all N nodes hold, or ``none``; exit 1 when fewer than N nodes answered.
* ``shared-prepare|shared-status|shared-collect|shared-stop ROOT`` -- on the login host: the command for every
  rank under a shared run root, answered as ``{"results": {rank: {...}}}``; status reads the state files only
  (the trainers run on other hosts).
* ``status RUN_DIR`` -- state, liveness, rc, the last trainer_log.jsonl entry, which expected outputs exist.
* ``watch RUN_DIR [--every S] [--for S]`` -- ``status`` as one JSON line every S seconds until nobody reads
  them (the launcher's streamed follow of many nodes, launcher/backends/ssh_stream.py).
* ``collect RUN_DIR`` -- the status, the output files, and ``collect.tar.gz`` (logs, state, metrics) to fetch.
* ``stop RUN_DIR [--grace S] [--dump-stacks]`` -- SIGTERM the trainer's process group and every process
  carrying the run's marker in its environment, SIGKILL what is left after the grace period, check that
  nothing is left. Idempotent. ``--dump-stacks`` (the progress watchdog saw a stall): first
  ``stack-<rank>-<pid>.txt`` of every process of the run (py-spy, the kernel's view of each thread) and a
  poke of the flight recorder.

Every process of a run carries ``MIFT_AGENT_KEY=<run_id>@<run_dir>`` in its environment; ``torchrun`` puts its
workers in new sessions, so the marker (not the process group) is what finds all of them. The key holds the
run directory so that two nodes sharing one machine (local tests) never touch each other's processes.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from . import contract
from .bundle import cmd_prepare
from .collect import cmd_collect
from .shared import SHARED_COMMANDS, cmd_shared
from .slurm import cmd_slurm_check, cmd_slurm_checkpoints, cmd_slurm_step, resume_step
from .status import cmd_status, cmd_watch
from .stop import cmd_stop
from .supervise import cmd_start


def main(argv: list[str] | None = None) -> int:  # noqa: PLR0912 - one branch per command
    """Parse the command line, run the command, print its JSON result."""
    parser = argparse.ArgumentParser(prog="mift_agent.py", description=__doc__.splitlines()[0])
    parser.add_argument(
        "command",
        choices=(
            "start",
            "prepare",
            "slurm-step",
            "status",
            "watch",
            "stop",
            "collect",
            "slurm-check",
            "slurm-checkpoints",
            "resume-step",
            *SHARED_COMMANDS,
        ),
    )
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--grace", type=float, default=10.0, help="seconds between SIGTERM and SIGKILL")
    parser.add_argument(
        "--wait", type=float, default=30.0, help="start: seconds to wait for the trainer to run"
    )
    parser.add_argument(
        "--ranks", action="store_true", help="slurm-step: RUN_DIR is a shared run root: rank<SLURM_NODEID>"
    )
    parser.add_argument("--restart", type=int, default=0, help="slurm-step: Slurm's restart count")
    parser.add_argument(
        "--resume-step",
        default="none",
        help="slurm-step --restart: the checkpoint step to resume from, or none",
    )
    parser.add_argument("--nodes", type=int, default=1, help="resume-step: how many nodes must answer")
    parser.add_argument("--every", type=float, default=5.0, help="watch: seconds between two statuses")
    parser.add_argument("--for", dest="for_s", type=float, default=1200.0, help="watch: seconds in all")
    parser.add_argument("--job-gone", action="store_true", help="shared-stop: the Slurm job left its nodes")
    parser.add_argument(
        "--dump-stacks", action="store_true", help="stop: stack dumps of every process of the run first"
    )
    args = parser.parse_args(argv)
    run_dir: Path = args.run_dir.resolve()
    if not run_dir.is_dir():
        print(
            json.dumps({"ok": False, "state": contract.ABSENT, "error": f"{run_dir}: no such run directory"})
        )
        return 0 if args.command != "start" else 1
    result: Any
    if args.command == "start":
        result = cmd_start(run_dir, args.grace, args.wait)
    elif args.command == "prepare":
        result = cmd_prepare(run_dir)
    elif args.command == "slurm-step":
        step = None if args.resume_step == "none" else int(args.resume_step)
        result = cmd_slurm_step(run_dir, args.grace, args.ranks, args.restart, step)
    elif args.command == "slurm-checkpoints":
        result = cmd_slurm_checkpoints(run_dir)
    elif args.command == "resume-step":
        try:
            found = resume_step(sys.stdin.read().splitlines(), args.nodes)
        except ValueError as err:
            print(f"mift_agent: resume-step: {err}", file=sys.stderr)
            return 1
        print("none" if found is None else found)
        return 0
    elif args.command == "slurm-check":
        result = cmd_slurm_check(run_dir)
    elif args.command in SHARED_COMMANDS:
        result = cmd_shared(args.command.removeprefix("shared-"), run_dir, args.grace, args.job_gone)
    elif args.command == "status":
        result = {"ok": True, **cmd_status(run_dir)}
    elif args.command == "watch":
        return cmd_watch(run_dir, args.every, args.for_s)
    elif args.command == "collect":
        result = cmd_collect(run_dir)
    else:
        result = cmd_stop(run_dir, args.grace, args.dump_stacks)
    print(json.dumps(result))
    return 0 if result.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
