"""Where a training rank's CPU goes on a test host: py-spy samples of one rank of a plain run, by phase.

On 2 hosts of rig ``--rig-id`` started from the provisioned host image (``mift_testsupport.image``), the
faults suite's job (2 ranks per host, gloo, the tiny model, 8 steps) runs once; on host1, py-spy (the node
venv's, which the launcher's stall dumps use) records the first rank from its start to its end (``--rate``
samples a second of the rank when not idle, ``--nonblocking``). The samples are sorted by what their stack
shows, first match wins:

* ``import``: a module being imported (``_find_and_load``): torch, transformers, DeepSpeed, PEFT, datasets,
  LLaMA-Factory;
* ``deepspeed init``: ``deepspeed.initialize`` and the ZeRO-3 optimizer's set-up;
* ``model load``, ``dataset``, ``save``, ``train steps`` (the training loop), ``other`` (native frames only,
  and the rest).

Then the modules that took the most samples while importing. What the numbers tell: the share of a rank's
start that any test run pays on every rank of every host it starts, whatever the case does after.

    python bench/rank_profile.py --rig-id 19
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "python"), str(REPO / "tests")]

from faults.conftest import JOBS  # noqa: E402
from mift_testsupport.cluster import Cluster  # noqa: E402
from mift_testsupport.image import provisioned_rig  # noqa: E402

SITE = "/opt/mift/venv/lib/python3.11/site-packages/"
# the first rank on the host: `python -u .../llamafactory/launcher.py` under torchrun ([-] keeps the watcher's
# own command line from matching); py-spy attaches once its interpreter is up
WATCH = (
    "nohup bash -c 'for i in $(seq 2400); do "
    f'p=$(pgrep -f -- "[-]u {SITE}llamafactory/launcher.py" | head -1); '
    'if [ -n "$p" ]; then sleep 0.3; '
    "/opt/mift/venv/bin/py-spy record --pid $p --duration 300 --rate {rate} --format raw "
    "--output /tmp/rank.raw --nonblocking > /tmp/rank-pyspy.log 2>&1; break; fi; sleep 0.05; done' "
    ">/dev/null 2>&1 &"
)
PHASES = (
    ("import", ("_find_and_load",)),
    (
        "deepspeed init",
        ("deepspeed/__init__.py:", "_configure_zero_optimizer", "DeepSpeedZeroOptimizer_Stage3.__init__"),
    ),
    ("model load", ("from_pretrained",)),
    ("dataset", ("get_dataset", "datasets/")),
    ("save", ("save_checkpoint", "_save_checkpoint", "save_model")),
    ("train steps", ("_inner_training_loop", "training_step")),
)


def phase_of(stack: str) -> str:
    """Return the phase a sampled stack belongs to (the first of ``PHASES`` whose marks it shows)."""
    return next((name for name, marks in PHASES if any(m in stack for m in marks)), "other")


def imported_module(stack: str) -> str | None:
    """Return the second module frame of an import stack (the one the first imported), site path cut off."""
    mods = re.findall(r"<module> \(([^:)]+)", stack)
    return mods[1].removeprefix(SITE) if len(mods) > 1 else None


def summarize(raw: str) -> tuple[int, collections.Counter[str], collections.Counter[str]]:
    """Return (samples, samples by phase, import samples by the module imported) of py-spy's raw output."""
    phases: collections.Counter[str] = collections.Counter()
    modules: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        total += n
        phase = phase_of(stack)
        phases[phase] += n
        if phase == "import" and (module := imported_module(stack)):
            modules[module] += n
    return total, phases, modules


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rig-id", type=int, default=19)
    parser.add_argument("--rate", type=int, default=100, help="samples a second")
    args = parser.parse_args()
    work = Path("/tmp") / f"mift-rank-profile-{args.rig_id}"
    subprocess.run(["rm", "-rf", str(work)], check=True)
    work.mkdir(parents=True)
    with provisioned_rig(args.rig_id, 2) as rig:
        cluster = Cluster(rig, work, real_backend=False, base=JOBS)
        rig.ssh(1, "rm -f /tmp/rank.raw /tmp/rank-pyspy.log; " + WATCH.format(rate=args.rate))
        t0 = time.monotonic()
        out = cluster.run("run", str(cluster.job("rank-profile")), "-i", str(cluster.inventory))
        print(f"plain 8-step run: exit {out.returncode}, {time.monotonic() - t0:.1f} s")
        deadline = time.monotonic() + 60
        while (
            time.monotonic() < deadline
            and "Wrote raw" not in rig.ssh(1, "cat /tmp/rank-pyspy.log; true").stdout
        ):
            time.sleep(1)
        raw = rig.ssh(1, "cat /tmp/rank.raw").stdout
    total, phases, modules = summarize(raw)
    print(
        f"host1's first rank: {total} samples at {args.rate}/s ({total / args.rate:.1f} s not idle; "
        "the shares, not the seconds, compare between machines)"
    )
    for phase, n in phases.most_common():
        print(f"  {phase:15s} {n:6d}  {n / total:6.1%}")
    print("while importing, by the module imported first (samples):")
    for module, n in modules.most_common(6):
        print(f"  {n:6d}  {module}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
