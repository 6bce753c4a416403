"""The one wrapper around ansible-runner: every playbook of the launcher runs through it."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ansible_runner

from launcher.exceptions import ConfigurationError
from launcher.spec.inventory import inventory_not_found
from launcher.spec.nodelayout import layout
from launcher.spec.repo import ANSIBLE_CFG, ANSIBLE_HOME, PLAYBOOK_DIR, SSH_CONTROL_DIR
from launcher.transfer import nodeprogram

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

LOG = logging.getLogger(__name__)

# huggingface_hub's token variables (launcher/transfer/hub.py reads them through the client): never in a
# playbook's environment
HUB_TOKEN_ENV = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
# ansible-runner runs `ansible-playbook` from PATH; these are passed through to it as they are
PASS_THROUGH_ENV = ("ANSIBLE_PRIVATE_KEY_FILE", "ANSIBLE_SSH_ARGS", "ANSIBLE_REMOTE_USER", "SSH_AUTH_SOCK")
KEEP_EVENTS = ("runner_on_failed", "runner_on_unreachable", "playbook_on_stats")
# the playbooks hand their results back with set_stats (per_host: false, aggregate: true) under this key:
# {host: {result name: value}}; ansible-runner delivers it as the stats event's artifact_data
RESULTS_KEY = "mift_results"
# in the environment of a background playbook's ansible-playbook: how RunningPlaybook.stop finds it
PLAYBOOK_TOKEN = "MIFT_PLAYBOOK_TOKEN"  # noqa: S105 - a variable's name, no secret
# seconds between two looks of ansible-runner at the cancel callback while a playbook prints nothing (its
# default: 5 s): Ctrl-C, or the end of a background playbook (:meth:`PlaybookRunner.start`), acts within this
CANCEL_CHECK_S = 0.5
# the env/ files ansible-runner writes unless suppress_env_files (env/settings is the runner's own, below)
ANSIBLE_RUNNER_ENV_FILES = ("envvars", "extravars", "passwords", "cmdline", "ssh_key")
# seconds a playbook asked to end (SIGTERM) has before ansible-runner's cancel (SIGKILL of its process group)
STOP_GRACE_S = 10.0


@dataclass
class PlaybookResult:
    """What one playbook run produced: rc, status, per-host stats, failures and reported results."""

    playbook: str
    rc: int
    status: str
    stats: dict[str, dict[str, int]] = field(default_factory=dict)
    # host -> result name -> its value, as the playbook handed it back (set_stats ``mift_results``)
    reports: dict[str, dict[str, Any]] = field(default_factory=dict)
    # host -> one line saying what failed (unreachable or a failed task)
    failures: dict[str, str] = field(default_factory=dict)
    unreachable: list[str] = field(default_factory=list)
    artifact_dir: str = ""

    @property
    def ok(self) -> bool:
        """Return True when the playbook succeeded on every host."""
        return self.rc == 0 and not self.failures

    def report(self, host: str, name: str) -> Any:  # noqa: ANN401 - JSON from the nodes
        """Return the result ``name`` a host handed back (``mift_results.<host>.<name>``), or None."""
        return self.reports.get(host, {}).get(name)

    def host_reports(self, name: str, host_pattern: str) -> tuple[list[str], dict[str, dict[str, Any]]]:
        """Return the hosts that handed back a ``name`` report, in the play's order (its ``play_hosts``), and
        host -> that report; raise ConfigurationError when no host did (the pattern matched none)."""
        reports = {h: r[name] for h, r in self.reports.items() if isinstance(r.get(name), dict)}
        if not reports:
            raise ConfigurationError(f"no hosts match {host_pattern!r} in the inventory")
        play_hosts = next(iter(reports.values())).get("play_hosts") or sorted(reports)
        return [h for h in play_hosts if h in reports], reports


@dataclass
class RunningPlaybook:
    """A playbook started in the background (:meth:`PlaybookRunner.start`)."""

    playbook: str
    thread: threading.Thread
    stop_requested: threading.Event

    def running(self) -> bool:
        """Return True while the playbook runs."""
        return self.thread.is_alive()

    def stop(self, wait_s: float = STOP_GRACE_S + 5) -> None:
        """End the playbook (as a Ctrl-C does: :func:`graceful_cancel`) and wait until it has."""
        self.stop_requested.set()
        self.thread.join(wait_s)


def graceful_cancel(wanted: Callable[[], bool], token: str) -> Callable[[], bool]:
    """Return ansible-runner's cancel callback for a playbook whose ansible-playbook has ``token`` in its
    environment (PLAYBOOK_TOKEN). Once ``wanted()`` is true it sends SIGTERM to that ansible-playbook, which
    hands it on to its workers and ends; the callback answers True (ansible-runner's cancel: SIGKILL of the
    playbook's process group) only when STOP_GRACE_S passed without that. Ansible runs each worker in a
    session of its own, so the SIGKILL alone would leave a worker to finish its task (a trainer started, on a
    node, after the stop that followed a Ctrl-C)."""
    sent_at: float | None = None

    def cancel() -> bool:
        nonlocal sent_at
        if not wanted():
            return False
        if sent_at is None:
            sent_at = time.monotonic()
            pid = _child_with(PLAYBOOK_TOKEN, token)
            if pid is None:
                return True  # not started yet, or already ending: nothing to hand a SIGTERM to
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            LOG.debug("SIGTERM to ansible-playbook %d", pid)
        return time.monotonic() - sent_at >= STOP_GRACE_S

    return cancel


def _child_with(name: str, value: str) -> int | None:
    """Return the pid of this process's child whose environment has ``name=value`` (Linux /proc), or None when
    there is none."""
    wanted = f"{name}={value}".encode()
    me = str(os.getpid())
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            ppid = proc.joinpath("stat").read_text().rsplit(")", 1)[1].split()[1]
            if ppid == me and wanted in proc.joinpath("environ").read_bytes().split(b"\0"):
                return int(proc.name)
        except (OSError, IndexError):
            continue
    return None


def failure_line(res: Mapping[str, Any], task: str) -> str:
    """Return one line saying why a task failed on a host (its message, else its last line of stderr)."""
    msg = str(res.get("msg") or "").strip()
    stderr = str(res.get("stderr") or "").strip()
    detail = msg if msg and msg != "non-zero return code" else stderr.splitlines()[-1] if stderr else msg
    return f"{task}: {detail}" if detail else task


class PlaybookRunner:
    """Run the repo's playbooks against one inventory, with artifacts under one private data dir.

    Args:
        private_data_dir: ansible-runner's private data dir (inside the run directory); created if missing.
        inventory: the user's inventory, or None for the ``ansible.cfg`` default.
        idle_timeout: seconds without output after which a playbook is stopped.
        job_timeout: seconds after which a playbook is stopped.
    """

    def __init__(
        self,
        private_data_dir: Path,
        *,
        inventory: Path | None = None,
        idle_timeout: int = 300,
        job_timeout: int = 1800,
    ) -> None:
        self.private_data_dir = private_data_dir
        self.inventory = inventory
        self.cancel_requested = threading.Event()
        self.last_status = ""
        private_data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        env_dir = private_data_dir / "env"
        env_dir.mkdir(exist_ok=True)
        # ansible-runner reads these back into every playbook when they exist (a run directory of a launcher
        # before suppress_env_files, below: the first playbook's PATH, token and extra vars)
        for stale in ANSIBLE_RUNNER_ENV_FILES:
            (env_dir / stale).unlink(missing_ok=True)
        (env_dir / "settings").write_text(
            json.dumps(
                {
                    "idle_timeout": idle_timeout,
                    "job_timeout": job_timeout,
                    "suppress_ansible_output": True,
                    "pexpect_timeout": CANCEL_CHECK_S,
                }
            )
        )
        if inventory is not None and not inventory.exists():
            raise inventory_not_found(inventory)
        # ansible-runner copies this process's whole environment into each playbook's artifacts/<n>/command
        # (the run directory): a hub token must not be there; the hub was asked before any playbook ran
        # (launcher/transfer/hub.py), and a later fetch in this process finds the token file only
        for name in HUB_TOKEN_ENV:
            os.environ.pop(name, None)
        self._envvars = self._build_envvars()
        self._base_args: dict[str, Any] = {
            "private_data_dir": str(private_data_dir),
            "quiet": True,
            "json_mode": False,
            "envvars": self._envvars,
            "finished_callback": self._finished,
            # nothing of a run goes to env/ files: ansible-runner writes its first run's envvars and
            # extravars there and reads them back for every later run of the same private data dir (the
            # envvars file over the later run's own: each playbook's token would be the first one's; the
            # first run's extravars passed again, before the later run's)
            "suppress_env_files": True,
        }
        if inventory is not None:
            self._base_args["inventory"] = str(inventory)

    @staticmethod
    def _build_envvars() -> dict[str, str]:
        venv_bin = str(Path(sys.executable).parent)
        path = os.environ.get("PATH", "/usr/bin:/bin")
        if venv_bin not in path.split(os.pathsep):
            path = venv_bin + os.pathsep + path
        if not (Path(venv_bin) / "ansible-playbook").exists() and not shutil.which(
            "ansible-playbook", path=path
        ):
            raise ConfigurationError("ansible-playbook not found: activate the project venv (.venv)")
        env = {
            "PATH": path,
            "ANSIBLE_CONFIG": str(ANSIBLE_CFG),
            "ANSIBLE_HOME": str(ANSIBLE_HOME),
            "ANSIBLE_LOCAL_TEMP": str(ANSIBLE_HOME / "tmp"),
            # a short folder, whatever the checkout's or the run's path (a ControlPath socket is <= 107 bytes)
            "ANSIBLE_SSH_CONTROL_PATH_DIR": str(SSH_CONTROL_DIR),
            "ANSIBLE_NOCOLOR": "1",
        }
        env.update({k: os.environ[k] for k in PASS_THROUGH_ENV if k in os.environ})
        return env

    def _finished(self, runner: Any) -> None:  # noqa: ANN401 - ansible_runner.Runner
        self.last_status = str(getattr(runner, "status", ""))

    def _next_number(self) -> int:
        """The number of the next playbook run in this private data dir: one more than any run's so far, also
        another runner's (the engine's, a later ``status`` or ``stop``), so that no run's artifacts replace an
        earlier run's of the same playbook. Each run leaves ``vars/NNN-<playbook>.json`` (_args)."""
        numbers = [int(f.name[:3]) for f in (self.private_data_dir / "vars").glob("[0-9][0-9][0-9]-*.json")]
        return max(numbers, default=0) + 1

    def _args(
        self,
        playbook: str,
        extravars: Mapping[str, Any],
        *,
        ident: str,
        event_handler: Callable[[dict[str, Any]], bool],
        cancel_callback: Callable[[], bool],
        limit: str | None = None,
        timeout: int | None = None,
    ) -> dict[str, Any]:
        """Return ansible-runner's arguments for one run of ``playbooks/<playbook>.yml``: its ansible-playbook
        has a token of its own in its environment, by which ``cancel_callback`` ends it (graceful_cancel), and
        its extra vars in a file of its own (``vars/<ident>.json``, 0600, passed as ``-e @file``): on the
        command line they would be readable in ``ps`` and bounded by one argument's 128 KiB."""
        artifact = self.private_data_dir / "artifacts" / ident
        if artifact.exists():
            shutil.rmtree(artifact)
        token = uuid.uuid4().hex
        vars_file = self.private_data_dir / "vars" / f"{ident}.json"
        vars_file.parent.mkdir(mode=0o700, exist_ok=True)
        fd = os.open(vars_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            # the node layout (one home: nodelayout) and the node program (one file: nodeprogram)
            json.dump({**layout().extravars(), **nodeprogram.extravars(), **extravars}, fh)
        args = dict(self._base_args)
        args.update(
            playbook=str(PLAYBOOK_DIR / f"{playbook}.yml"),
            ident=ident,
            extravars=str(vars_file),
            event_handler=event_handler,
            cancel_callback=graceful_cancel(cancel_callback, token),
            envvars={**self._envvars, PLAYBOOK_TOKEN: token},
        )
        if limit:
            args["limit"] = limit
        if timeout:
            args["timeout"] = timeout
        return args

    def run(
        self,
        playbook: str,
        extravars: Mapping[str, Any],
        *,
        limit: str | None = None,
        cancellable: bool = True,
        keep_events: bool = True,
        ident: str | None = None,
        timeout: int | None = None,
    ) -> PlaybookResult:
        """Run ``playbooks/<playbook>.yml`` with ``extravars`` (passed as data, never as a string).

        Args:
            playbook: playbook name under ``playbooks/`` without ``.yml``.
            extravars: variables for the playbook.
            limit: Ansible ``--limit`` pattern.
            cancellable: :attr:`cancel_requested` stops the playbook (Ctrl-C); cleanup runs pass False.
            keep_events: write job events to the artifacts dir (off for frequent polls).
            ident: artifacts sub-directory name; a fresh numbered one by default. An existing one is replaced.
            timeout: job timeout for this run, in seconds.
        """
        ident = ident or f"{self._next_number():03d}-{playbook}"
        result = PlaybookResult(
            playbook=playbook,
            rc=-1,
            status="unstarted",
            artifact_dir=str(self.private_data_dir / "artifacts" / ident),
        )

        def on_event(event: dict[str, Any]) -> bool:
            kind = event.get("event")
            if kind in KEEP_EVENTS:
                self._collect(result, event)
            return keep_events

        cancel = self.cancel_requested.is_set if cancellable else (lambda: False)
        args = self._args(
            playbook,
            extravars,
            ident=ident,
            event_handler=on_event,
            cancel_callback=cancel,
            limit=limit,
            timeout=timeout,
        )
        LOG.debug("ansible-runner: %s ident=%s", playbook, ident)
        runner = ansible_runner.run(**args)
        result.rc = int(runner.rc) if runner.rc is not None else -1
        result.status = str(runner.status)
        result.stats = {k: v for k, v in (runner.stats or {}).items() if isinstance(v, dict)}
        if result.status == "failed" and result.rc == 0:
            result.rc = 1
        return result

    def start(
        self,
        playbook: str,
        extravars: Mapping[str, Any],
        *,
        on_event: Callable[[dict[str, Any]], None],
        ident: str,
        timeout: int | None = None,
    ) -> RunningPlaybook:
        """Start ``playbooks/<playbook>.yml`` in the background; hand each of its events to ``on_event`` (in
        ansible-runner's thread) as it comes, none written to disk. :attr:`cancel_requested` (Ctrl-C) or
        :meth:`RunningPlaybook.stop` ends it, its workers with it."""
        stop = threading.Event()

        def handle(event: dict[str, Any]) -> bool:
            on_event(event)
            return False

        args = self._args(
            playbook,
            extravars,
            ident=ident,
            event_handler=handle,
            cancel_callback=lambda: stop.is_set() or self.cancel_requested.is_set(),
            timeout=timeout,
        )
        LOG.debug("ansible-runner (background): %s ident=%s", playbook, ident)
        thread, _runner = ansible_runner.run_async(**args)
        return RunningPlaybook(playbook, thread, stop)

    @staticmethod
    def _collect(result: PlaybookResult, event: dict[str, Any]) -> None:
        data = event.get("event_data", {})
        host = str(data.get("host", ""))
        task = str(data.get("task", ""))
        res = data.get("res") or {}
        kind = event["event"]
        if kind == "runner_on_unreachable":
            result.unreachable.append(host)
            result.failures[host] = f"unreachable: {str(res.get('msg', '')).strip()}"
        elif kind == "runner_on_failed" and not data.get("ignore_errors"):
            result.failures.setdefault(host, failure_line(res, task))
        if kind == "playbook_on_stats":
            handed = (data.get("artifact_data") or {}).get(RESULTS_KEY)
            if isinstance(handed, dict):
                for name, values in handed.items():
                    if isinstance(values, dict):
                        result.reports.setdefault(str(name), {}).update(values)


def make_runner(private_data_dir: Path, *, inventory: Path | None = None) -> PlaybookRunner:
    """The one place the launcher builds its Ansible runner: every command and engine step asks here.

    The test seam too: a test that must see no playbook run (or that stands in for the nodes) replaces
    ``PlaybookRunner`` in this module, and every runner the launcher builds is the replacement.
    """
    return PlaybookRunner(private_data_dir, inventory=inventory)
