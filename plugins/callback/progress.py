# Copyright: the mi300x-finetune authors
# Apache-2.0 (see the repository's pyproject.toml)
"""mift.cluster.progress: provisioning progress (phase, hosts done per phase, elapsed, the long steps)."""

from __future__ import annotations

import os
import re
import time
from typing import Any

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = r"""
name: progress
type: aggregate
short_description: Provisioning progress beside the default output
description:
  - Prints C([progress]) lines for the playbooks named in O(playbooks) (default C(provision.yml)), beside the
    stdout callback's own output.
  - The current phase (each play, numbered among the playbook's plays) when it starts, with its hosts; the
    phase's hosts done (ok, failed, unreachable) and its time when it ends; the elapsed time on every line.
  - The long steps (the DKMS build of amdgpu-dkms, the reboot wait, the wheel builds) named when they start
    and each host's time when it ends.
  - While a phase runs, one line at a task start when nothing was printed for O(heartbeat_s) seconds.
  - docs/conventions.md "Provisioning progress".
options:
  playbooks:
    description: File names of the playbooks whose runs get progress lines (any directory).
    type: list
    elements: str
    default: [provision.yml]
    env:
      - name: MIFT_PROGRESS_PLAYBOOKS
    ini:
      - section: callback_mift_progress
        key: playbooks
  heartbeat_s:
    description: A task start prints a line when nothing was printed for this many seconds (0 never).
    type: float
    default: 60
    env:
      - name: MIFT_PROGRESS_HEARTBEAT_S
    ini:
      - section: callback_mift_progress
        key: heartbeat_s
"""

# long step -> what tells its tasks: the module (action) or the task's name
LONG_STEPS: tuple[tuple[str, tuple[str, ...], re.Pattern[str] | None], ...] = (
    ("reboot wait", ("ansible.builtin.reboot", "reboot"), None),
    ("DKMS build", (), re.compile(r"amdgpu-dkms|amdgpu driver packages|\bDKMS build", re.IGNORECASE)),
    ("wheel build", (), re.compile(r"\bbuild\b.*(wheel|once)|wheel cache", re.IGNORECASE)),
)


# tasks that do no long work whatever their names say (an argument check, an assert, a fact)
NOT_WORK = frozenset(
    f"{prefix}{module}"
    for prefix in ("", "ansible.builtin.")
    for module in ("validate_argument_spec", "assert", "set_fact", "debug", "meta", "fail")
)
# tasks that only open a block of tasks: the step starts there, its own tasks say when it ends
WRAPPERS = frozenset(
    f"{prefix}{module}"
    for prefix in ("", "ansible.builtin.")
    for module in ("include_role", "import_role", "include_tasks", "import_tasks")
)


def long_step(action: str, name: str) -> str | None:
    """Return the long step a task is (``DKMS build``, ``reboot wait``, ``wheel build``), or None."""
    if action in NOT_WORK:
        return None
    for step, actions, pattern in LONG_STEPS:
        if action in actions or (pattern is not None and pattern.search(name)):
            return step
    return None


def clock(seconds: float) -> str:
    """Return ``H:MM:SS``."""
    whole = int(seconds)
    return f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


class CallbackModule(CallbackBase):
    """Progress lines for provisioning runs."""

    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "mift.cluster.progress"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # noqa: ANN401 - CallbackBase's
        super().__init__(*args, **kwargs)
        self.active = False
        self.t0 = 0.0
        self.last_line = 0.0
        self.plays: list[str] = []
        self.phase = 0
        self.phase_name = ""
        self.phase_t0 = 0.0
        self.hosts: list[str] = []
        self.failed: set[str] = set()
        self.unreachable: set[str] = set()
        self.seen: set[str] = set()
        self.gone: set[str] = (
            set()
        )  # failed or unreachable in an earlier phase: Ansible runs nothing more there
        self.tasks = 0
        self.batch = 1
        self.long: dict[str, tuple[str, str, float]] = {}  # task uuid -> (step, task name, start)
        self.next_play = 0  # the place in the playbook's plays after the current one
        self.now = time.monotonic  # replaced by the unit test's clock

    def _line(self, text: str) -> None:
        self.last_line = self.now()
        self._display.display(f"[progress] {text}; elapsed {clock(self.last_line - self.t0)}")

    def v2_playbook_on_start(self, playbook: Any) -> None:  # noqa: ANN401 - Ansible's Playbook
        names = self.get_option("playbooks")
        self.active = os.path.basename(str(playbook._file_name)) in names  # noqa: PTH119
        if not self.active:
            return
        self.t0 = self.now()
        self.plays = [play.get_name() for play in playbook.get_plays()]
        self.next_play = 0
        self._line(f"{os.path.basename(playbook._file_name)}: {len(self.plays)} phases")  # noqa: PTH119

    def _done(self) -> list[str]:
        """Return the phase's hosts that ran its tasks and are still in (every batch so far)."""
        return sorted(self.seen - self.failed - self.unreachable)

    def _end_phase(self) -> None:
        if not self.phase:
            return
        done = self._done()
        self.gone |= self.failed | self.unreachable
        extra = "".join(
            f", {len(s)} {word} ({', '.join(sorted(s))})"
            for s, word in ((self.failed, "failed"), (self.unreachable, "unreachable"))
            if s
        )
        self._line(
            f"phase {self.phase}/{len(self.plays)} {self.phase_name!r} done: {len(done)}/{len(self.hosts)} "
            f"hosts{extra} in {clock(self.now() - self.phase_t0)}"
        )
        self.phase = 0

    def v2_playbook_on_play_start(self, play: Any) -> None:  # noqa: ANN401 - Ansible's Play
        if not self.active:
            return
        name = play.get_name()
        if self.phase and name == self.phase_name:  # a rolling play's next batch (serial): the same phase
            self.batch += 1
            self._line(
                f"phase {self.phase}/{len(self.plays)} {name!r} batch {self.batch}: {len(self._done())}/"
                f"{len(self.hosts)} hosts done so far"
            )
            return
        self._end_phase()
        # the play's place among the playbook's plays, after the last one (a name may stand more than once;
        # a rolling play starts once per batch: the same place, above)
        later = [i for i in range(self.next_play, len(self.plays)) if self.plays[i] == name]
        self.phase = later[0] + 1 if later else min(self.next_play + 1, len(self.plays))
        self.next_play = self.phase
        self.phase_name = name
        self.phase_t0 = self.now()
        self.failed, self.unreachable, self.seen, self.tasks, self.batch = set(), set(), set(), 0, 1
        try:  # every batch's hosts (a rolling play), less those that failed in an earlier phase
            inventory = play.get_variable_manager()._inventory
            hosts = inventory.get_hosts(play.hosts, ignore_restrictions=True)
            self.hosts = [h.name for h in hosts if h.name not in self.gone]
        except (AttributeError, TypeError):
            self.hosts = []
        if not self.hosts:  # nothing to do there (e.g. the Slurm plays without mift_slurm)
            self._line(f"phase {self.phase}/{len(self.plays)} {name!r}: no hosts, skipped")
            self.phase = 0
            return
        self._line(f"phase {self.phase}/{len(self.plays)} {name!r} started: {len(self.hosts)} hosts")

    def v2_playbook_on_task_start(self, task: Any, is_conditional: bool) -> None:  # noqa: ANN401
        if not self.active:
            return
        self.tasks += 1
        name = task.get_name()
        step = long_step(str(task.action), name)
        if step is not None:
            if str(task.action) not in WRAPPERS:  # a wrapper returns at once: no "done" line for it
                self.long[str(task._uuid)] = (step, name, self.now())
            active = len([h for h in self.hosts if h not in self.failed | self.unreachable])
            self._line(
                f"long step: {step} ({name!r}) on {active} hosts, phase {self.phase}/{len(self.plays)}"
            )
            return
        heartbeat = float(self.get_option("heartbeat_s"))
        if heartbeat > 0 and self.now() - self.last_line >= heartbeat:
            self._line(
                f"phase {self.phase}/{len(self.plays)} {self.phase_name!r}: task {self.tasks} {name!r}"
            )

    def _host_ended(self, result: Any, outcome: str) -> None:  # noqa: ANN401 - Ansible's task result
        if not self.active:
            return
        host = result._host.get_name()
        self.seen.add(host)
        if outcome == "failed":
            self.failed.add(host)
        elif outcome == "unreachable":
            self.unreachable.add(host)
        started = self.long.get(str(result._task._uuid))
        if started is not None and outcome != "skipped":
            step, _, t = started
            self._line(f"long step done: {step} on {host} ({outcome}) in {clock(self.now() - t)}")

    def v2_runner_on_ok(self, result: Any) -> None:  # noqa: ANN401
        self._host_ended(result, "changed" if result._result.get("changed") else "ok")

    def v2_runner_on_failed(self, result: Any, ignore_errors: bool = False) -> None:  # noqa: ANN401
        self._host_ended(result, "ignored" if ignore_errors else "failed")

    def v2_runner_on_unreachable(self, result: Any) -> None:  # noqa: ANN401
        self._host_ended(result, "unreachable")

    def v2_runner_on_skipped(self, result: Any) -> None:  # noqa: ANN401
        self._host_ended(result, "skipped")

    def v2_playbook_on_stats(self, stats: Any) -> None:  # noqa: ANN401 - Ansible's AggregateStats
        if not self.active:
            return
        self._end_phase()
        hosts = sorted(stats.processed)
        bad = [h for h in hosts if stats.summarize(h)["failures"] or stats.summarize(h)["unreachable"]]
        self._line(f"done: {len(self.plays)} phases, {len(hosts) - len(bad)}/{len(hosts)} hosts ok")
