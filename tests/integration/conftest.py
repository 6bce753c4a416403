"""Shared fixtures for tests that run on the project's test rig (tools/testhosts/rig).

A test asks for hosts with the ``rig_factory`` fixture (function scope) or ``rig_module_factory``
(module scope)::

    def test_something(rig_factory):
        rig = rig_factory(rig_id=3, hosts=2, profiles={2: "mi250x"})
        assert rig.ssh(1, "hostname").stdout.strip() == "host1"

Helpers (``Rig``, ``leftovers``, ``rig_instance``, ``rig_ready_or_skip``, ``run``, paths, and the
provisioning helpers ``make_tiny_model``, ``provision``, ``is_provisioned``, ``TEST_DOUBLE_VARS`` shared by
the launcher e2e tests and the faults suite) are reached through the ``rig_lib`` fixture (this module),
because test modules cannot import a conftest reliably; ``tests/faults/conftest.py`` loads this file by path.

Whatever happens in the test, every instance the factory brought up is torn down (``rig down --purge``) and
checked for leftovers. Each test module must use its own RIG_ID (conventions: rig 0 is the demo cluster;
``test_rig.py`` uses 1), because instances with the same id share bridge, addresses and state.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
RIG = REPO_ROOT / "tools" / "testhosts" / "rig"
RIG_HOME = Path(os.environ.get("RIG_HOME", REPO_ROOT / ".rig"))
ANSIBLE_CFG = REPO_ROOT / "ansible.cfg"
# what provision.yml needs on the test hosts (the switches of inventory/demo/group_vars/all.yml)
TEST_DOUBLE_VARS = {
    "rocm_repo_base_url": "http://controller:8080/amd",
    "rocm_manage_kernel": False,
    "host_tuning_apply": False,
    "pytorch_backend": "cpu",
}


def _ansible_bin(name: str) -> str:
    """The Ansible CLI next to this interpreter (the project venv), else from PATH."""
    candidate = Path(sys.executable).parent / name
    if candidate.exists():
        return str(candidate)
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"{name} not found next to {sys.executable} nor on PATH")
    return found


@dataclass
class Rig:
    """One running rig instance (RIG_ID) with hosts host1..hostN."""

    rig_id: int
    hosts: int
    systemd: bool = False
    profiles: dict[int, str] = field(default_factory=dict)

    @property
    def net(self) -> str:
        return f"10.231.{self.rig_id}"

    @property
    def controller_ip(self) -> str:
        return f"{self.net}.1"

    @property
    def state_dir(self) -> Path:
        return RIG_HOME / str(self.rig_id)

    @property
    def inventory(self) -> Path:
        return self.state_dir / "inventory.yml"

    @property
    def ssh_config(self) -> Path:
        return RIG_HOME / "ssh" / "config"

    def ip(self, host: int) -> str:
        return f"{self.net}.{10 + host}"

    def env(self) -> dict[str, str]:
        """Environment for rig and Ansible commands against this instance."""
        env = dict(os.environ)
        env["RIG_ID"] = str(self.rig_id)
        env["RIG_HOME"] = str(RIG_HOME)
        env["ANSIBLE_CONFIG"] = str(ANSIBLE_CFG)
        env["ANSIBLE_NOCOLOR"] = "1"
        env["ANSIBLE_DEPRECATION_WARNINGS"] = "0"
        return env

    def rig(self, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """Run ``tools/testhosts/rig ARGS`` for this instance."""
        return run([str(RIG), *args], env=self.env(), check=check, timeout=timeout)

    def up(
        self, hosts: int | None = None, profiles: Mapping[int, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        args = ["up", str(hosts or self.hosts)]
        if self.systemd:
            args.append("--systemd")
        for host, name in sorted((profiles if profiles is not None else self.profiles).items()):
            args += ["--profile", f"{host}={name}"]
        return self.rig(*args)

    def down(self, *, purge: bool = False) -> subprocess.CompletedProcess[str]:
        return self.rig("down", *(["--purge"] if purge else []))

    def ssh(
        self, host: int, command: str, *, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """Run a shell command on hostN as root over ssh (no stdin)."""
        argv = ["ssh", "-F", str(self.ssh_config), "-o", "BatchMode=yes", self.ip(host), command]
        return run(argv, check=check, timeout=timeout, stdin=subprocess.DEVNULL)

    def ansible(
        self, *args: str, check: bool = True, timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        """Run ``ansible -i <this inventory> ARGS`` from the repo root with the repo's ansible.cfg."""
        argv = [_ansible_bin("ansible"), "-i", str(self.inventory), *args]
        return run(argv, env=self.env(), check=check, timeout=timeout, cwd=REPO_ROOT)


def run(
    argv: list[str],
    *,
    env: Mapping[str, str] | None = None,
    check: bool = True,
    timeout: float = 300,
    cwd: Path | None = None,
    stdin: int | None = subprocess.DEVNULL,
) -> subprocess.CompletedProcess[str]:
    """subprocess.run with text output; on ``check`` failure the error shows the command's output."""
    proc = subprocess.run(
        argv,
        env=dict(env) if env is not None else None,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        stdin=stdin,
        check=False,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"command failed (rc={proc.returncode}): {' '.join(argv)}\n"
            f"--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}"
        )
    return proc


def make_tiny_model(dest: Path) -> Path:
    """Write the tiny LLaMA model (tools/make_tiny_model.py) to ``dest`` unless it is there; return it."""
    if not (dest / "config.json").exists():
        run([sys.executable, str(REPO_ROOT / "tools" / "make_tiny_model.py"), str(dest)], timeout=600)
    return dest


def provision(
    rig: Rig, model: Path, *, log: Path | None = None, timeout: float = 3600
) -> subprocess.CompletedProcess[str]:
    """Run provision.yml on the rig with the test-double switches and ``model``; assert that it passed.

    The playbook's output goes to ``log`` when given.
    """
    extra = {**TEST_DOUBLE_VARS, "train_configs_model_src": str(model)}
    out = run(
        [
            _ansible_bin("ansible-playbook"),
            "provision.yml",
            "-i",
            str(rig.inventory),
            "-e",
            json.dumps(extra),
        ],
        env=rig.env(),
        cwd=REPO_ROOT,
        timeout=timeout,
        check=False,
    )
    if log is not None:
        log.write_text(out.stdout + out.stderr)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]
    return out


def is_provisioned(rig: Rig) -> bool:
    """Return True when every host of the rig has the node venv and the stack fact (provision.yml ran)."""
    probe = "test -x /opt/mift/venv/bin/llamafactory-cli && test -s /etc/ansible/facts.d/mift_stack.fact"
    return all(rig.ssh(h, probe, check=False).returncode == 0 for h in range(1, rig.hosts + 1))


def _pid_state(pid: str) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "gone"
    return stat.rsplit(")", 1)[1].split()[0]


def leftovers(rig_id: int) -> list[str]:
    """Everything of instance ``rig_id`` that ``rig down`` should have removed, one line per item."""
    found: list[str] = []
    netns = run(["ip", "netns", "list"], check=False).stdout
    found += [f"netns {m}" for m in re.findall(rf"^(mift{rig_id}h\d+)\b", netns, re.MULTILINE)]
    links = run(["ip", "-o", "link", "show"], check=False).stdout
    found += [f"link {m}" for m in re.findall(rf"^\d+: (mift{rig_id}(?:br|h\d+v))[@:]", links, re.MULTILINE)]
    tcp = run(["ss", "-tnpH", "dst", f"10.231.{rig_id}.0/24"], check=False).stdout
    found += [
        f"tcp connection {line.split()[4]} {line.split()[-1]}" for line in tcp.splitlines() if "pid=" in line
    ]
    state = str(RIG_HOME / str(rig_id)) + "/"
    server = f"--bind 10.231.{rig_id}.1"
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or proc.name == str(os.getpid()):
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            mountinfo = (proc / "mountinfo").read_text(errors="replace")
        except OSError:
            continue
        if _pid_state(proc.name) in {"Z", "X", "gone"}:
            continue
        if state in cmdline or server in cmdline:
            found.append(f"process {proc.name}: {cmdline.strip()}")
        for line in mountinfo.splitlines():
            if " - overlay " in line and state in line:
                found.append(f"overlay mount in pid {proc.name}: {line[:200]}")
                break
    for cg in [
        *Path("/sys/fs/cgroup").glob(f"*/mift{rig_id}h*"),
        *Path("/sys/fs/cgroup").glob(f"mift{rig_id}h*"),
    ]:
        found.append(f"cgroup {cg}")
    return found


def rig_ready_or_skip(*, systemd: bool = False) -> None:
    """Skip when the rig cannot run here at all (not root); fail when ``rig setup`` was not run."""
    if os.geteuid() != 0:
        pytest.skip("the test rig needs root (network namespaces, bridges, mounts)")
    base = RIG_HOME / ("base-systemd" if systemd else "base") / "rootfs" / "usr" / "sbin" / "sshd"
    if systemd and not base.exists():
        pytest.skip(f"systemd mode not set up ({base} missing): run tools/testhosts/rig setup --systemd")
    if not base.exists() or not (RIG_HOME / "repo" / "pypi" / "simple" / "index.html").exists():
        pytest.fail(f"test rig not set up ({base} or the PyPI index missing): run tools/testhosts/rig setup")


@contextmanager
def rig_instance(
    rig_id: int, hosts: int, *, systemd: bool = False, profiles: Mapping[int, str] | None = None
) -> Iterator[Rig]:
    """Bring up ``hosts`` hosts of instance ``rig_id``; always ``rig down --purge`` afterwards."""
    rig = Rig(rig_id=rig_id, hosts=hosts, systemd=systemd, profiles=dict(profiles or {}))
    rig.down(purge=True)  # a previous run killed before its teardown
    try:
        rig.up()
        yield rig
    finally:
        rig.down(purge=True)


RigFactory = Callable[..., Rig]


@contextmanager
def _factory() -> Iterator[RigFactory]:
    with ExitStack() as stack:

        def make(
            rig_id: int, hosts: int, *, systemd: bool = False, profiles: Mapping[int, str] | None = None
        ) -> Rig:
            rig_ready_or_skip(systemd=systemd)
            return stack.enter_context(rig_instance(rig_id, hosts, systemd=systemd, profiles=profiles))

        yield make


@pytest.fixture
def rig_factory() -> Iterator[RigFactory]:
    """``rig_factory(rig_id, hosts, systemd=False, profiles=None) -> Rig``; torn down after the test."""
    with _factory() as make:
        yield make


@pytest.fixture(scope="module")
def rig_module_factory() -> Iterator[RigFactory]:
    """Like ``rig_factory`` but torn down after the module (for slow converge-once tests)."""
    with _factory() as make:
        yield make


@pytest.fixture(scope="session")
def rig_lib() -> ModuleType:
    """This module: ``rig_lib.Rig``, ``rig_lib.leftovers``, ``rig_lib.rig_instance``, paths."""
    return sys.modules[__name__]
