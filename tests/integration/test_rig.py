"""The test rig itself (tools/testhosts/rig): hosts, network, containment, Ansible, GPU profiles, teardown.

Uses RIG_ID 1 (``RIG_TESTS_RIG_ID``). Needs root and ``tools/testhosts/rig setup``.
"""

from __future__ import annotations

import re
import time
import uuid
from pathlib import Path

import pytest
import yaml

from mift_testsupport.fixtures import rig_ready_or_skip
from mift_testsupport.paths import REPO_ROOT, RIG, RIG_HOME
from mift_testsupport.proc import run
from mift_testsupport.rig import Rig, leftovers, rig_id_from_env, rig_instance

pytestmark = pytest.mark.rig

RIG_ID = rig_id_from_env("RIG_TESTS_RIG_ID", 1)


def _wait_no_leftovers(rig_id: int, seconds: float = 10) -> list[str]:
    """Leftovers after ``seconds`` (ssh clients may need a moment to notice their server is gone)."""
    deadline = time.monotonic() + seconds
    while True:
        found = leftovers(rig_id)
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.5)


def test_three_hosts_answer_ssh_with_their_names(rig_factory) -> None:
    rig = rig_factory(RIG_ID, 3)
    for host in (1, 2, 3):
        out = rig.ssh(host, "hostname; cat /etc/hostname; ps -o comm= -p 1; stat -f -c %T /").stdout.split()
        assert out[:2] == [f"host{host}", f"host{host}"], out
        assert out[2] == "sshd", f"PID 1 on host{host} is {out[2]}, expected sshd (plain mode)"
        assert out[3] == "overlayfs", f"/ on host{host} is {out[3]}"
    status = rig.rig("status").stdout
    for host in (1, 2, 3):
        assert re.search(rf"^host{host}\s+up\s+{re.escape(rig.ip(host))}\s", status, re.MULTILINE), status
    inventory = yaml.safe_load(rig.inventory.read_text())
    trainers = inventory["all"]["children"]["trainers"]["hosts"]
    assert {name: h["ansible_host"] for name, h in trainers.items()} == {
        f"host{i}": rig.ip(i) for i in (1, 2, 3)
    }
    assert rig.rig("inventory").stdout.strip() == str(rig.inventory)


def test_hosts_reach_each_other_by_name_and_ip(rig_factory) -> None:
    rig = rig_factory(RIG_ID, 3)
    token = uuid.uuid4().hex
    rig.ssh(2, f"mkdir -p /tmp/www && echo {token} > /tmp/www/token")
    # a simple command with its fds redirected, so that the ssh session can end (see docs/testhosts.md)
    rig.ssh(2, "setsid -f python3 -m http.server 8000 --directory /tmp/www >/tmp/www.log 2>&1 </dev/null")
    fetch = (
        "python3 -c 'import sys, time, urllib.request as u\n"
        "for _ in range(50):\n"
        "    try: print(u.urlopen(sys.argv[1], timeout=5).read().decode().strip()); break\n"
        "    except OSError: time.sleep(0.2)\n"
        "' "
    )
    assert rig.ssh(1, fetch + "http://host2:8000/token").stdout.strip() == token
    assert rig.ssh(3, fetch + f"http://{rig.ip(2)}:8000/token").stdout.strip() == token


def test_hosts_have_no_route_out(rig_factory) -> None:
    rig = rig_factory(RIG_ID, 1)
    route = rig.ssh(1, "ip route show default").stdout
    assert f"via {rig.net}.254" in route, route
    # 192.0.2.1 is TEST-NET-1 (RFC 5737): never routed; the packet cannot leave the bridge anyway
    probe = (
        "python3 -c 'import errno, socket\n"
        "try:\n"
        '    socket.create_connection(("192.0.2.1", 80), timeout=8); print("CONNECTED")\n'
        'except TimeoutError: print("TIMEOUT")\n'
        "except OSError as e: print(errno.errorcode.get(e.errno, e))\n"
        "'"
    )
    result = rig.ssh(1, probe, timeout=60).stdout.strip()
    assert result in {"EHOSTUNREACH", "ENETUNREACH"}, f"connect to 192.0.2.1 from host1 gave {result!r}"
    # no DNS either
    assert rig.ssh(1, "getent hosts deb.debian.org", check=False).returncode != 0


def test_ansible_ping_over_rig_inventory(rig_factory) -> None:
    rig = rig_factory(RIG_ID, 3)
    out = rig.ansible("all", "-m", "ansible.builtin.ping").stdout
    for host in (1, 2, 3):
        assert re.search(rf"^host{host} \| SUCCESS", out, re.MULTILINE), out
    facts = rig.ansible("host1", "-m", "ansible.builtin.setup", "-a", "filter=ansible_default_ipv4").stdout
    # the facts see the rig address and the (nonexistent) gateway that keeps traffic on the bridge
    assert re.search(rf"address\W+{re.escape(rig.ip(1))}\b", facts), facts
    assert re.search(rf"gateway\W+{re.escape(rig.net)}\.254\b", facts), facts


def test_hosts_see_controller_repos(rig_factory) -> None:
    rig = rig_factory(RIG_ID, 1)
    assert rig.ssh(1, "cat /etc/apt/sources.list").stdout.strip() == (
        "deb [trusted=yes] http://controller:8080/debs ./"
    )
    assert "index-url = http://controller:8080/pypi/simple/" in rig.ssh(1, "cat /etc/pip.conf").stdout
    apt = rig.ssh(1, "apt-get update -q && apt-cache policy jq", timeout=120).stdout
    assert "http://controller:8080/debs" in apt, apt
    index = rig.ssh(
        1,
        "python3 -c 'import urllib.request as u; print(u.urlopen(\"http://controller:8080/pypi/simple/\").read().decode())'",
    ).stdout
    assert 'href="torch/"' in index and 'href="deepspeed/"' in index, index[:500]


def _rocm_apt_line() -> str:
    defaults = yaml.safe_load((REPO_ROOT / "roles" / "rocm" / "defaults" / "main.yml").read_text())
    version = str(defaults["rocm_version"])
    return f"deb [trusted=yes] http://controller:8080/amd/rocm/apt/{version} jammy main"


def test_gpu_profile_per_host(rig_factory) -> None:
    rig = rig_factory(RIG_ID, 3, profiles={2: "mi250x"})
    profiles = {h: rig.ssh(h, "cat /etc/mift-testdouble/gpu-profile").stdout.strip() for h in (1, 2, 3)}
    assert profiles == {1: "mi300x", 2: "mi250x", 3: "mi300x"}
    assert re.search(r"^host2\s+up\s.*profile=mi250x", rig.rig("status").stdout, re.MULTILINE)
    amd = RIG_HOME / "repo" / "amd"
    if not amd.is_dir():
        pytest.skip(f"{amd} absent: the AMD repo test double (setup.d/amd-repo.sh) is not built")
    install = (
        f"echo '{_rocm_apt_line()}' > /etc/apt/sources.list.d/rocm.list && apt-get update -q >/dev/null && "
        "DEBIAN_FRONTEND=noninteractive apt-get install -y -q rocminfo >/dev/null && "
        # like AMD's package, the double installs into /opt/rocm-<version>/bin (the rocm role sets PATH)
        "for d in /opt/rocm*/bin; do PATH=$PATH:$d; done; rocminfo"
    )
    assert "gfx942" in rig.ssh(1, install, timeout=300).stdout
    host2 = rig.ssh(2, install, timeout=300).stdout
    assert "gfx90a" in host2 and "gfx942" not in host2


def test_profile_change_on_running_host(rig_factory) -> None:
    rig = rig_factory(RIG_ID, 2)
    pids = (rig.state_dir / "hosts" / "1" / "pid").read_text()
    rig.up(profiles={1: "mi210"})
    assert rig.ssh(1, "cat /etc/mift-testdouble/gpu-profile").stdout.strip() == "mi210"
    assert (rig.state_dir / "hosts" / "1" / "pid").read_text() == pids, "host1 was restarted"


def test_bad_input_is_rejected_with_one_line() -> None:
    rig_ready_or_skip()
    rig = Rig(rig_id=RIG_ID, hosts=2)
    rig.down(purge=True)
    try:
        bad = rig.rig("up", "2", "--profile", "2=mi999", check=False)
        assert bad.returncode != 0
        assert bad.stderr.strip().count("\n") == 0 and "mi999" in bad.stderr and "mi300x" in bad.stderr, (
            bad.stderr
        )
        assert not leftovers(RIG_ID), "a rejected 'up' started something"
        for args in (["up", "0"], ["up", "two"], ["up", "2", "--profile", "5=mi210"], ["down", "--force"]):
            proc = rig.rig(*args, check=False)
            assert proc.returncode != 0 and proc.stderr.startswith("rig: "), (args, proc.stderr)
        env = rig.env() | {"RIG_ID": "12"}
        proc = run([str(RIG), "status"], env=env, check=False)
        assert proc.returncode != 0 and "RIG_ID" in proc.stderr, proc.stderr
    finally:
        rig.down(purge=True)


def test_up_when_up_is_a_noop(rig_factory) -> None:
    rig = rig_factory(RIG_ID, 3)
    hosts = rig.state_dir / "hosts"
    before = {h: (hosts / str(h) / "pid").read_text() for h in (1, 2, 3)}
    http_before = (rig.state_dir / "http.pid").read_text()
    out = rig.up().stdout
    assert out.count("already up") == 3, out
    assert {h: (hosts / str(h) / "pid").read_text() for h in (1, 2, 3)} == before
    assert (rig.state_dir / "http.pid").read_text() == http_before
    assert rig.ssh(3, "hostname").stdout.strip() == "host3"


def test_down_leaves_nothing_twice_in_a_row() -> None:
    rig_ready_or_skip()
    rig = Rig(rig_id=RIG_ID, hosts=3)
    rig.down(purge=True)
    try:
        for _ in range(2):
            rig.up()
            # what a test leaves behind: Ansible ControlPersist masters, a daemon in a host, an ssh session
            rig.ansible("all", "-m", "ansible.builtin.ping")
            rig.ssh(1, "setsid -f sleep 600 >/dev/null 2>&1 </dev/null")
            assert rig.ssh(2, "hostname").stdout.strip() == "host2"
            rig.down()
            assert _wait_no_leftovers(RIG_ID) == []
            rig.down()  # idempotent
    finally:
        rig.down(purge=True)
    assert not rig.state_dir.exists()


def test_down_after_a_killed_run_without_pid_files() -> None:
    rig_ready_or_skip()
    rig = Rig(rig_id=RIG_ID, hosts=2)
    rig.down(purge=True)
    try:
        rig.up()
        # as if the test (and its state files) had been lost: down must still find everything
        for pid_file in [*rig.state_dir.glob("hosts/*/pid"), rig.state_dir / "http.pid"]:
            pid_file.unlink()
        rig.down()
        assert _wait_no_leftovers(RIG_ID) == []
    finally:
        rig.down(purge=True)


def test_teardown_runs_when_the_test_body_fails() -> None:
    rig_ready_or_skip()
    with pytest.raises(RuntimeError, match="test body failed"), rig_instance(RIG_ID, 2) as rig:
        assert rig.ssh(1, "hostname").stdout.strip() == "host1"
        raise RuntimeError("test body failed")
    assert _wait_no_leftovers(RIG_ID) == []
    assert not (RIG_HOME / str(RIG_ID)).exists()


def test_demo_inventory_points_at_rig0_with_relative_paths() -> None:
    inventory = yaml.safe_load((REPO_ROOT / "inventory" / "demo" / "hosts.yml").read_text())
    hosts = inventory["all"]["children"]["trainers"]["hosts"]
    assert {n: h["ansible_host"] for n, h in hosts.items()} == {
        "host1": "10.231.0.11",
        "host2": "10.231.0.12",
    }
    key = inventory["all"]["vars"]["ansible_ssh_private_key_file"]
    assert key.startswith("{{ inventory_dir }}/../../.rig/ssh/")
    assert Path(REPO_ROOT / "inventory" / "demo" / "../../.rig/ssh").resolve() == (REPO_ROOT / ".rig" / "ssh")


def test_systemd_mode(rig_factory) -> None:
    rig = rig_factory(RIG_ID, 2, systemd=True)
    for host in (1, 2):
        state = rig.ssh(host, "systemctl is-system-running --wait", check=False, timeout=120).stdout.strip()
        assert state == "running", f"host{host}: systemctl is-system-running says {state}"
        assert rig.ssh(host, "ps -o comm= -p 1").stdout.strip() == "systemd"
    assert rig.ssh(1, "hostname").stdout.strip() == "host1"
    rig.down()
    assert _wait_no_leftovers(RIG_ID) == []


def test_image_save_then_up_gives_each_host_its_own_identity(rig_factory) -> None:
    """``rig image save`` keeps a host's changes (files, removals); ``up --image`` starts hosts with them,
    each with its own hostname, /etc/hosts, GPU profile and ssh host keys; an image in use is not removed."""
    name = f"test-{uuid.uuid4().hex[:8]}"
    rig = rig_factory(RIG_ID, 1)
    rig.ssh(1, "mkdir -p /opt/mift-image-test && echo kept > /opt/mift-image-test/file && rm /etc/issue.net")
    source_key = rig.ssh(1, "cat /etc/ssh/ssh_host_ed25519_key.pub").stdout.split()[1]
    try:
        saved = rig.rig("image", "save", name, "--host", "1")
        assert f"image {name}" in saved.stdout, saved.stdout
        rig.down(purge=True)
        clone = Rig(rig_id=RIG_ID, hosts=2, image=name)
        clone.up(profiles={2: "mi250x"})
        try:
            seen = {}
            for host in (1, 2):
                probe = (
                    "hostname; cat /opt/mift-image-test/file; test -e /etc/issue.net && echo present || "
                    "echo removed; cat /etc/mift-testdouble/gpu-profile; "
                    "cut -d' ' -f2 /etc/ssh/ssh_host_ed25519_key.pub; grep -c host /etc/hosts"
                )
                seen[host] = clone.ssh(host, probe).stdout.split()
            assert seen[1][:4] == ["host1", "kept", "removed", "mi300x"], seen
            assert seen[2][:4] == ["host2", "kept", "removed", "mi250x"], seen
            assert len({seen[1][4], seen[2][4], source_key}) == 3, "ssh host keys shared with the source host"
            assert seen[1][5] == seen[2][5] == "2", seen  # both peers in /etc/hosts
            mixed = clone.rig("up", "3", check=False)
            assert mixed.returncode != 0 and f"image '{name}'" in mixed.stderr, mixed.stderr
            layered = clone.rig("image", "save", f"{name}-2", check=False)
            assert layered.returncode != 0 and f"runs on image '{name}'" in layered.stderr, layered.stderr
            in_use = clone.rig("image", "rm", name, check=False)
            assert in_use.returncode != 0 and "in use by rig" in in_use.stderr, in_use.stderr
        finally:
            clone.down(purge=True)
        for bad in (["up", "1", "--image", "no-such-image"], ["up", "1", "--image", "../x"]):
            proc = clone.rig(*bad, check=False)
            assert proc.returncode != 0 and proc.stderr.startswith("rig: "), (bad, proc.stderr)
            assert proc.stderr.strip().count("\n") == 0, proc.stderr
    finally:
        run([str(RIG), "image", "rm", name], env=rig.env(), check=False)
    assert not (RIG_HOME / "images" / name).exists()
