"""One instance of the project's test rig (``tools/testhosts/rig``): its hosts, ssh, Ansible, teardown.

Instances with the same ``RIG_ID`` share a bridge, addresses and state, so every suite uses its own id; each
suite reads it from an environment variable with the suite's default (:func:`rig_id_from_env`), so that
sessions running side by side can move a suite to a free id.
"""

from __future__ import annotations

import os
import re
import subprocess
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from mift_testsupport.paths import ANSIBLE_CFG, REPO_ROOT, RIG, RIG_HOME
from mift_testsupport.proc import ansible_bin, run

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping


def rig_id_from_env(variable: str, default: int) -> int:
    """Return the rig id in ``$variable`` (0-99), else ``default``; a bad value is an error."""
    text = os.environ.get(variable, "") or str(default)
    if not re.fullmatch(r"[0-9]|[1-9][0-9]", text):
        raise ValueError(f"{variable}={text!r}: a rig id is 0-99")
    return int(text)


@dataclass
class Rig:
    """One running rig instance (``RIG_ID``) with hosts host1..hostN."""

    rig_id: int
    hosts: int
    systemd: bool = False
    profiles: dict[int, str] = field(default_factory=dict)
    image: str | None = None
    # systemd mode: a controller folder bind-mounted at the same path into every host (RIG_SHARED_DIR), the
    # stand-in for a cluster's shared file system
    shared_dir: str | None = None

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

    def netns(self, host: int) -> str:
        """The network namespace of hostN (``ip -n NS ...`` cuts and restores its link)."""
        return f"mift{self.rig_id}h{host}"

    def env(self) -> dict[str, str]:
        """Environment for rig and Ansible commands against this instance."""
        env = dict(os.environ)
        env["RIG_ID"] = str(self.rig_id)
        env["RIG_HOME"] = str(RIG_HOME)
        env["ANSIBLE_CONFIG"] = str(ANSIBLE_CFG)
        env["ANSIBLE_NOCOLOR"] = "1"
        env["ANSIBLE_DEPRECATION_WARNINGS"] = "0"
        env.pop("RIG_SHARED_DIR", None)
        if self.shared_dir:
            env["RIG_SHARED_DIR"] = self.shared_dir
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
        if self.image:
            args += ["--image", self.image]
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
        argv = [ansible_bin("ansible"), "-i", str(self.inventory), *args]
        return run(argv, env=self.env(), check=check, timeout=timeout, cwd=REPO_ROOT)

    def playbook(
        self, playbook: str | Path, *args: str, timeout: float = 1800
    ) -> subprocess.CompletedProcess[str]:
        """Run ``ansible-playbook -i <this inventory> PLAYBOOK ARGS`` from the repo root; never raises."""
        argv = [ansible_bin("ansible-playbook"), "-i", str(self.inventory), str(playbook), *args]
        return run(argv, env=self.env(), check=False, timeout=timeout, cwd=REPO_ROOT)


def not_ready_reason(*, systemd: bool = False) -> tuple[str, str] | None:
    """Why the rig cannot run here: ``("skip", why)`` (not root, no systemd mode), ``("fail", why)``
    (``rig setup`` was not run), or None when it can."""
    if os.geteuid() != 0:
        return "skip", "the test rig needs root (network namespaces, bridges, mounts)"
    base = RIG_HOME / ("base-systemd" if systemd else "base") / "rootfs" / "usr" / "sbin" / "sshd"
    if systemd and not base.exists():
        return "skip", f"systemd mode not set up ({base} missing): run tools/testhosts/rig setup --systemd"
    if not base.exists() or not (RIG_HOME / "repo" / "pypi" / "simple" / "index.html").exists():
        return (
            "fail",
            f"test rig not set up ({base} or the PyPI index missing): run tools/testhosts/rig setup",
        )
    return None


@contextmanager
def rig_instance(
    rig_id: int,
    hosts: int,
    *,
    systemd: bool = False,
    profiles: Mapping[int, str] | None = None,
    image: str | None = None,
    shared_dir: str | None = None,
) -> Iterator[Rig]:
    """Bring up ``hosts`` hosts of instance ``rig_id``; always ``rig down --purge`` afterwards."""
    rig = Rig(
        rig_id=rig_id,
        hosts=hosts,
        systemd=systemd,
        profiles=dict(profiles or {}),
        image=image,
        shared_dir=shared_dir,
    )
    rig.down(purge=True)  # a previous run killed before its teardown
    try:
        rig.up()
        yield rig
    finally:
        rig.down(purge=True)


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
