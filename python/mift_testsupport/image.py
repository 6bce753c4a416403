"""The provisioned host image: ``provision.yml`` run once on one test host, kept as a rig image.

Suites that need a provisioned cluster but do not test provisioning (the launcher end to end, the faults
suite) start their hosts from this image (``rig up N --image provisioned``: seconds) instead of provisioning
again (minutes). The image is made when it is missing or was made from other inputs (the playbooks, roles,
requirements, configs, the rig's base and repositories, the test-double variables): once per CI run from a
clean clone, once per change of those inputs on a workstation. A file lock lets suites running side by side
wait for one build.

What a host provisioned as host1 carries that would be wrong on another host is redone per host. The
rig writes hostname, /etc/hosts and the GPU profile and makes new ssh host keys. Compared file by file with
a host2 provisioned by ``provision.yml`` beside host1 (rig 9, 2026-12-03), the rest differs only where host1
was the wheel builder: :func:`make_hosts_their_own` turns a clone that is not host1 into what provisioning
leaves on a non-builder. No rig address is recorded on a host (``train_address`` lives in the inventory),
so an image serves every rig id.

    python -m mift_testsupport.image [--rig-id N] [--name NAME] [--force]    # CI's host-image stage
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from mift_testsupport.paths import REPO_ROOT, RIG_HOME
from mift_testsupport.provision import TEST_DOUBLE_VARS, provision, tiny_model
from mift_testsupport.rig import Rig, rig_id_from_env, rig_instance

if TYPE_CHECKING:
    from collections.abc import Iterator

IMAGE = "provisioned"
# made on a systemd-mode host, so its clones are too (a rig image keeps its mode): one image for every suite,
# including those that need services (Slurm's daemons, tests/integration/test_slurm_e2e.py); a second image in
# plain mode would cost CI a second provision.yml
SYSTEMD = True
IMAGES = RIG_HOME / "images"
# what the image is made from: a change in any of these makes a new one
INPUT_PATHS = (
    "provision.yml",
    "ansible.cfg",
    "playbooks",
    "roles",
    "plugins",
    "requirements",
    "configs",
    "inventory/demo/group_vars",
    "tools/make_tiny_model.py",
    "tools/testhosts",
    "python/mift_testsupport/provision.py",
)
# applied by the suites that test them, never by the image (provision.yml imports the Slurm play only with
# mift_slurm true): a change there must not make a new image; the launcher's playbooks live in its package
NOT_INPUTS = (
    "roles/munge/",
    "roles/slurm_config/",
    "roles/slurm_controller/",
    "roles/slurm_node/",
    "playbooks/slurm",
)
# the rig's shared state the hosts see (rebuilt by `rig setup` when its inputs change)
RIG_STAMPS = ("base/stamp", "repo/debs/stamp", "repo/pypi/stamp", "repo/amd/.built-from")


def inputs_key() -> str:
    """A digest of everything the provisioned image is made from."""
    # the variables name files under RIG_HOME: the digest takes them relative to it, so that a copy of a rig
    # home (a second checkout's, a helper's) keeps its image current
    variables = json.dumps(TEST_DOUBLE_VARS, sort_keys=True).replace(str(RIG_HOME), "<RIG_HOME>")
    digest = hashlib.sha256(variables.encode())
    for top in INPUT_PATHS:
        root = REPO_ROOT / top
        files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root]
        for path in files:
            rel = path.relative_to(REPO_ROOT).as_posix()
            if "__pycache__" in path.parts or not path.exists() or rel.startswith(NOT_INPUTS):
                continue
            digest.update(str(path.relative_to(REPO_ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    for stamp in RIG_STAMPS:
        path = RIG_HOME / stamp
        digest.update(stamp.encode() + b"\0" + (path.read_bytes() if path.exists() else b"-") + b"\0")
    return digest.hexdigest()[:20]


def _key_file(name: str) -> Path:
    return IMAGES / f"{name}.inputs"


def is_current(name: str = IMAGE) -> bool:
    """True when image ``name`` exists and was made from the present inputs."""
    key = _key_file(name)
    return (IMAGES / name / "meta").exists() and key.exists() and key.read_text().strip() == inputs_key()


@contextlib.contextmanager
def _lock(name: str) -> Iterator[None]:
    (RIG_HOME / "locks").mkdir(parents=True, exist_ok=True)
    with (RIG_HOME / "locks" / f"image-{name}.lock").open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def ensure_image(name: str = IMAGE, *, rig_id: int, log: Path | None = None, force: bool = False) -> float:
    """Make image ``name`` unless it is current: ``provision.yml`` on host1 (systemd mode) of rig ``rig_id``,
    then ``rig image save``; the rig is taken down afterwards. Returns the seconds spent making it (0:
    current)."""
    with _lock(name):
        if is_current(name) and not force:
            return 0.0
        t0 = time.monotonic()
        _key_file(name).unlink(missing_ok=True)
        with rig_instance(rig_id, 1, systemd=SYSTEMD) as rig:
            provision(rig, tiny_model(), log=log)
            rig.rig("image", "save", name, "--host", "1", timeout=900)
        _key_file(name).write_text(inputs_key() + "\n")
        return time.monotonic() - t0


# on a host that is not the wheel builder, provision.yml leaves none of these (the builder's build scratch,
# pip cache, build log and build helper) and records built_here false in the wheels fact
BUILDER_ONLY = (
    "/var/tmp/mift-wheel-build",  # noqa: S108 - a path on the test host, not a temp file of ours
    "/root/.cache/pip",
    "/var/log/mift/wheel-builds.log",
    "/usr/local/libexec/mift/mift_build_wheel.py",
)
NOT_BUILDER = (
    'sed -i \'s/"built_here": true/"built_here": false/\' /etc/ansible/facts.d/mift_wheels.fact && '
    f"rm -rf {' '.join(BUILDER_ONLY)}"
)


def make_hosts_their_own(rig: Rig) -> None:
    """Make every clone but host1 (the builder: first of ``trainers``, as on the source) a non-builder.

    Byte for byte what ``provision.yml`` leaves on host2 (checked: the sed gives host2's wheels fact exactly),
    so a later ``provision.yml`` on the clones changes nothing there.
    """
    for host in range(2, rig.hosts + 1):
        rig.ssh(host, NOT_BUILDER)


@contextlib.contextmanager
def provisioned_rig(
    rig_id: int,
    hosts: int,
    *,
    name: str = IMAGE,
    log: Path | None = None,
    shared_dir: str | None = None,
    stale_ok: bool = False,
) -> Iterator[Rig]:
    """``hosts`` provisioned hosts (systemd mode) of rig ``rig_id`` started from image ``name`` (made first
    when needed); taken down (``rig down --purge``) afterwards. ``shared_dir``: a controller folder
    bind-mounted at the same path into every host (a shared file system's stand-in). ``stale_ok``: an
    image made from other inputs will do (the suite runs ``provision.yml`` on the hosts itself, as README's
    rehearsal does: the re-run brings them to the present inputs); only a missing image is made."""
    if not (stale_ok and (IMAGES / name / "meta").exists()):
        ensure_image(name, rig_id=rig_id, log=log)
    with rig_instance(rig_id, hosts, image=name, systemd=SYSTEMD, shared_dir=shared_dir) as rig:
        make_hosts_their_own(rig)
        yield rig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mift_testsupport.image", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--rig-id", type=int, default=rig_id_from_env("MIFT_IMAGE_RIG_ID", 5))
    parser.add_argument("--name", default=IMAGE)
    parser.add_argument("--force", action="store_true", help="make it even when it is current")
    parser.add_argument("--log", type=Path, default=REPO_ROOT / ".cache" / "host-image" / "provision.log")
    args = parser.parse_args(argv)
    args.log.parent.mkdir(parents=True, exist_ok=True)
    took = ensure_image(args.name, rig_id=args.rig_id, log=args.log, force=args.force)
    if took:
        print(
            f"image {args.name}: provision.yml on rig {args.rig_id} host1, saved, in {took:.0f} s "
            f"(log {args.log})"
        )
    else:
        print(f"image {args.name}: current (inputs {inputs_key()}), nothing to do")
    return 0


if __name__ == "__main__":
    sys.exit(main())
