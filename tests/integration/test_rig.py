"""The test rig itself (tools/testhosts/rig): hosts, network, containment, Ansible, GPU profiles, teardown.

Uses RIG_ID 1 (``RIG_TESTS_RIG_ID``). Needs root and ``tools/testhosts/rig setup``.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import json
import os
import re
import shlex
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from urllib.parse import urlsplit

import pytest
import yaml

from mift_testsupport.fixtures import rig_ready_or_skip
from mift_testsupport.paths import REPO_ROOT, RIG, RIG_HOME
from mift_testsupport.proc import run
from mift_testsupport.rig import Rig, leftovers, rig_id_from_env, rig_instance

pytestmark = pytest.mark.rig

RIG_ID = rig_id_from_env("RIG_TESTS_RIG_ID", 1)


HOSTCONFIG = REPO_ROOT / "tools" / "testhosts" / "hostconfig.py"


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


def _hostconfig() -> ModuleType:
    spec = importlib.util.spec_from_file_location("hostconfig", HOSTCONFIG)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("hostconfig", module)
    spec.loader.exec_module(module)
    return module


def _resolve_on_controller(names: list[str], seconds: float = 10) -> dict[str, list[str]]:
    """The controller's addresses for each name (at most 2 each; none where it does not resolve in time)."""

    def lookup(name: str) -> list[str]:
        try:
            infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
        except OSError:
            return []
        return list(dict.fromkeys(str(info[4][0]) for info in infos))[:2]

    pool = ThreadPoolExecutor(max_workers=max(1, len(names)))
    futures = {name: pool.submit(lookup, name) for name in names}
    done, _ = wait(futures.values(), timeout=seconds)
    pool.shutdown(wait=False, cancel_futures=True)
    return {name: f.result() if f in done else [] for name, f in futures.items()}


# connect to each HOST:PORT of argv at once (each bounded by a 5 s timeout); print JSON
_PROBE = """
import errno, json, socket, sys, time
from concurrent.futures import ThreadPoolExecutor
def probe(target):
    host, port = target.rsplit(":", 1)
    t0 = time.monotonic()
    try:
        socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
        resolved = True
    except socket.gaierror:
        resolved = False
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
        connect = "CONNECTED"
    except TimeoutError:
        connect = "TIMEOUT"
    except socket.gaierror:
        connect = "NORESOLVE"
    except OSError as e:
        connect = errno.errorcode.get(e.errno, str(e))
    return target, {"resolved": resolved, "connect": connect, "seconds": round(time.monotonic() - t0, 2)}
with ThreadPoolExecutor(len(sys.argv) - 1) as pool:
    print(json.dumps(dict(pool.map(probe, sys.argv[1:]))))
"""


def test_hosts_have_no_route_out(rig_factory) -> None:
    rig = rig_factory(RIG_ID, 1)
    route = rig.ssh(1, "ip route show default").stdout
    assert f"via {rig.net}.254" in route, route
    # the places rig setup downloads from, as the controller's apt and pip configuration names them
    hostconfig = _hostconfig()
    urls = hostconfig.controller_urls(os.environ, os.environ.get("RIG_PIP_PYTHON", "python3"))
    endpoints = hostconfig.network_endpoints(urls)
    names = [host for host, _ in endpoints if not _is_address(host)]
    addresses = _resolve_on_controller(names)
    targets = [f"{host}:{port}" for host, port in endpoints]
    targets += [f"{a}:{port}" for host, port in endpoints for a in addresses.get(host, [])]
    targets.append("192.0.2.1:80")  # TEST-NET-1 (RFC 5737): never routed anywhere
    targets = list(dict.fromkeys(targets))
    command = "python3 -c " + shlex.quote(_PROBE) + " " + " ".join(shlex.quote(t) for t in targets)
    found = json.loads(rig.ssh(1, command, timeout=60).stdout)
    print(f"outside targets from {urls}: {json.dumps(found, indent=1)}")
    assert set(found) == set(targets)
    for target, result in found.items():
        host = target.rsplit(":", 1)[0]
        assert result["seconds"] < 10, f"{target} from host1: took {result['seconds']} s"
        if _is_address(host):
            # no route: the ARP request for the absent gateway gets no answer
            assert result["connect"] in {"EHOSTUNREACH", "ENETUNREACH", "TIMEOUT"}, (
                f"{target} from host1: {result}"
            )
        else:
            assert (result["resolved"], result["connect"]) == (False, "NORESOLVE"), (
                f"{target} from host1: {result}"
            )
            assert rig.ssh(1, f"getent hosts {shlex.quote(host)}", check=False).returncode != 0, host


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class _RecordingServer(ThreadingHTTPServer):
    """A stand-in mirror and index on 127.0.0.1: records the paths asked for and answers 404.

    A Debian mirror request (``/dists/``) is answered only once an index request came (at most 60 s later), so
    that both of rig setup's parallel downloads are seen before debootstrap's failure ends the setup.
    """

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _RecordingHandler)
        self.paths: list[str] = []
        self.index_asked = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _RecordingHandler(BaseHTTPRequestHandler):
    server: _RecordingServer

    def do_GET(self) -> None:
        self.server.paths.append(self.path)
        if "/dists/" in self.path:
            self.server.index_asked.wait(60)
        else:
            self.server.index_asked.set()
        self.send_error(404)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def recording_server() -> Iterator[_RecordingServer]:
    server = _RecordingServer()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def _setup_env(rig_home: Path, **extra: str) -> dict[str, str]:
    """rig setup's environment: a fresh RIG_HOME, no pip configuration files nor PIP_/RIG_ variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "RIG_"))}
    return env | {"RIG_ID": str(RIG_ID), "RIG_HOME": str(rig_home), "PIP_CONFIG_FILE": os.devnull} | extra


@pytest.mark.parametrize("how", ["configuration", "override"])
def test_setup_downloads_from_the_configured_mirror_and_index(
    tmp_path: Path, recording_server: _RecordingServer, how: str
) -> None:
    if os.geteuid() != 0:
        pytest.skip("rig setup needs root")
    url = recording_server.url
    parts = tmp_path / "sources.list.d"
    parts.mkdir()
    # a disabled and a security stanza first: neither may be taken
    (parts / "controller.sources").write_text(
        "Types: deb\nURIs: http://192.0.2.7/debian\nSuites: bookworm\nEnabled: no\n\n"
        f"Types: deb\nURIs: {url}/security/debian-security\nSuites: bookworm-security\n\n"
        "# the controller's mirror\n"
        f"Types: deb\nURIs: {url}/configured/debian\nSuites: bookworm bookworm-updates\n"
    )
    sources = {"RIG_APT_SOURCES_LIST": str(tmp_path / "sources.list"), "RIG_APT_SOURCES_DIR": str(parts)}
    if how == "configuration":
        # PIP_INDEX_URL is pip configuration (pip config list shows it as :env:.index-url)
        env = _setup_env(tmp_path / "rig", **sources, PIP_INDEX_URL=f"{url}/configured/simple/")
        mirror, index = f"{url}/configured/debian", f"{url}/configured/simple/"
        origins = (f"{parts}/controller.sources:11", "pip config :env:.index-url")
    else:
        mirror, index = f"{url}/override/debian", f"{url}/override/simple/"
        env = _setup_env(
            tmp_path / "rig",
            **sources,
            PIP_INDEX_URL=f"{url}/configured/simple/",
            RIG_MIRROR=mirror,
            RIG_INDEX_URL=index,
        )
        origins = ("RIG_MIRROR", "RIG_INDEX_URL")
    proc = run([str(RIG), "setup"], env=env, check=False, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "rig: debootstrap failed" in proc.stderr, (
        out
    )  # the stand-in has no archive
    assert f"debian mirror: {mirror} (from {origins[0]})" in out, out
    assert f"python index: {index} (from {origins[1]})" in out, out
    assert f"debootstrap bookworm (plain) from {mirror}" in out, out
    mirror_path, index_path = (urlsplit(u).path for u in (mirror, index))
    asked = list(recording_server.paths)
    assert any(p.startswith(f"{mirror_path}/dists/bookworm/") for p in asked), asked
    assert any(p.startswith(index_path) for p in asked), asked
    assert all(p.startswith((mirror_path, index_path)) for p in asked), asked


def test_setup_without_any_mirror_is_one_line(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("rig setup needs root")
    env = _setup_env(
        tmp_path / "rig",
        RIG_APT_SOURCES_LIST=str(tmp_path / "absent.list"),
        RIG_APT_SOURCES_DIR=str(tmp_path),
    )
    proc = run([str(RIG), "setup"], env=env, check=False, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith(
        "rig: mirror: no Debian mirror for bookworm"
    ), proc.stderr
    assert "RIG_MIRROR=" in proc.stderr and str(tmp_path / "absent.list") in proc.stderr
    assert not (tmp_path / "rig").exists(), "setup started building before it knew its mirror"


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
    # the rocm role's default is mift_defaults' (the one home of shared defaults)
    defaults = yaml.safe_load((REPO_ROOT / "roles" / "mift_defaults" / "defaults" / "main.yml").read_text())
    version = str(defaults["mift_defaults_rocm_version"])
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
        for bad_id in ("100", "07", "x"):  # ids are 0-99, no leading zero (one bridge and subnet per id)
            env = rig.env() | {"RIG_ID": bad_id}
            proc = run([str(RIG), "status"], env=env, check=False)
            assert proc.returncode != 0 and "RIG_ID" in proc.stderr, (bad_id, proc.stderr)
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


def test_cpu_counts_the_hosts_processes_and_keeps_the_count_across_down(rig_factory) -> None:
    rig = rig_factory(RIG_ID, 1)
    if rig.rig("cpu").stdout.strip() == "-":
        pytest.skip("this controller has no cgroup v1 cpuacct: rig cpu counts nothing here")
    before = float(rig.rig("cpu").stdout)
    # one CPU-second burnt in a process of host1 (over ssh, as the tests' trainers run)
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 1.0: pass"
    rig.ssh(1, f"python3 -c {shlex.quote(burn)}")
    after = float(rig.rig("cpu").stdout)
    assert after - before >= 1.0, (before, after)
    refused = rig.rig("cpu", "--forget", check=False)  # a count still in use is not dropped
    assert refused.returncode != 0 and "still has processes" in refused.stderr, refused
    rig.down()
    # the count outlives the hosts: CI reads it after a stage (and forgets it at its end, which this test does
    # not do: the rig-tests stage's own count runs on this rig id)
    assert float(rig.rig("cpu").stdout) >= after


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
                    "cut -d' ' -f2 /etc/ssh/ssh_host_ed25519_key.pub; grep -cE ' host[0-9]+$' /etc/hosts"
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
