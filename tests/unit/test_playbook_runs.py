"""Each playbook run of the runner on its own.

Ending one (Ctrl-C, the end of a follow): ``graceful_cancel`` sends a SIGTERM to the playbook's own
``ansible-playbook`` (found by the token in its environment), which hands it on to its workers, and lets
ansible-runner's SIGKILL of the process group come only ``STOP_GRACE_S`` later. A real child process of this
test, with the token in its environment, stands in for ``ansible-playbook``.

Its environment and extra vars: no env/ file of ansible-runner carries the first playbook's into the later
ones, and the extra vars are a private file per run, not command-line text."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import ansible_runner
import pytest

from launcher.backends import runner
from launcher.backends.runner import PLAYBOOK_TOKEN, PlaybookRunner, graceful_cancel

TOKEN = "0123456789abcdef"


@pytest.fixture
def playbook_standin() -> Iterator[subprocess.Popen[bytes]]:
    """A child with the token in its environment, which ends on SIGTERM (as ansible-playbook does)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], env={PLAYBOOK_TOKEN: TOKEN, "PATH": "/usr/bin"}
    )
    yield proc
    proc.kill()
    proc.wait()


def test_nothing_is_sent_until_the_end_is_wanted(playbook_standin: subprocess.Popen[bytes]) -> None:
    cancel = graceful_cancel(lambda: False, TOKEN)
    assert [cancel() for _ in range(3)] == [False, False, False]
    assert playbook_standin.poll() is None


def test_a_wanted_end_is_a_sigterm_first_and_the_sigkill_only_after_the_grace(
    playbook_standin: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner, "STOP_GRACE_S", 0.3)
    cancel = graceful_cancel(lambda: True, TOKEN)
    assert cancel() is False  # the SIGTERM went out: ansible-runner keeps waiting for the playbook to end
    assert playbook_standin.wait(timeout=10) == -signal.SIGTERM
    assert cancel() is False
    time.sleep(0.35)
    assert cancel() is True  # the grace is over: ansible-runner's own cancel (SIGKILL of the process group)


def test_only_the_playbook_with_the_token_gets_the_signal(playbook_standin: subprocess.Popen[bytes]) -> None:
    cancel = graceful_cancel(lambda: True, "another-playbooks-token")
    assert cancel() is True  # no child of this process has that token: ansible-runner's cancel at once
    assert playbook_standin.poll() is None


def test_a_run_directory_keeps_no_env_file_of_an_earlier_playbook(tmp_path: Path) -> None:
    """ansible-runner reads env/envvars and env/extravars back into every playbook of a private data dir: the
    runner writes none, and removes those of a run directory made before (a `status` or `stop` of an older
    run), so that each playbook gets its own environment, token and extra vars."""
    env = tmp_path / "ansible" / "env"
    env.mkdir(parents=True)
    for name in ("envvars", "extravars", "cmdline"):
        (env / name).write_text('{"MIFT_PLAYBOOK_TOKEN": "the-first-playbooks"}')
    playbooks = PlaybookRunner(tmp_path / "ansible")
    assert sorted(p.name for p in env.iterdir()) == ["settings"]
    assert playbooks._base_args["suppress_env_files"] is True


def test_each_playbook_gets_its_extra_vars_in_a_private_file_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not on ansible-playbook's command line (readable in ps, one argument at most 128 KiB): a 0600 file
    per playbook run, whatever its size."""
    given: list[dict[str, object]] = []

    def ansible_runner_test_double(**kwargs: object) -> object:  # records what the runner was given
        given.append(kwargs)
        return SimpleNamespace(rc=0, status="successful", stats={})

    monkeypatch.setattr(ansible_runner, "run", ansible_runner_test_double)
    playbooks = PlaybookRunner(tmp_path / "ansible")
    big = {f"node{i:04d}": "k" * 64 for i in range(4000)}  # 4000 hosts' torch keys: over 300 KB of JSON
    playbooks.run("preflight", {"mift_torch_known": big})
    playbooks.run("launch", {"mift_run_id": "r1"})
    files = [Path(str(kwargs["extravars"])) for kwargs in given]
    assert [f.name for f in files] == ["001-preflight.json", "002-launch.json"]
    assert [oct(f.stat().st_mode & 0o777) for f in files] == ["0o600", "0o600"]
    first, second = (json.loads(f.read_text()) for f in files)
    assert first["mift_torch_known"] == big and "mift_torch_known" not in second
    assert second["mift_run_id"] == "r1"


def test_a_later_runner_of_the_same_run_numbers_on_and_replaces_no_earlier_artifacts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine's runner, then another one on the same run directory (``status``, ``stop``): the numbers go
    on, so no playbook run's artifacts replace an earlier run's of the same playbook."""
    idents: list[str] = []

    def ansible_runner_test_double(**kwargs: object) -> object:  # records the ident it was given
        idents.append(str(kwargs["ident"]))
        return SimpleNamespace(rc=0, status="successful", stats={})

    monkeypatch.setattr(ansible_runner, "run", ansible_runner_test_double)
    for playbooks in ("preflight", "launch", "collect"), ("poll", "collect"):
        runner = PlaybookRunner(tmp_path / "ansible")
        for playbook in playbooks:
            runner.run(playbook, {})
    assert idents == ["001-preflight", "002-launch", "003-collect", "004-poll", "005-collect"]
