"""The node programs as one file: the zipapp ``mift_node-<hash>.pyz`` built here from :mod:`launcher.node`.

Built with the standard library's :mod:`zipapp` into the launcher's cache (``<cache>/node/``), named by the
hash of the package's sources (a changed source is a new file; an unchanged one is built once). The nodes keep
it under :data:`NODE_DIR` with the same name, so a playbook sends it only where it is missing
(``playbooks/tasks/node_program.yml``); the launch playbook then copies it into the run directory
(``<run_dir>/mift_node.pyz``), where poll, stop, collect and the Slurm steps run it. Run on a node as
``python3 mift_node-<hash>.pyz PROGRAM ARGS...`` (:mod:`launcher.node.__main__`).
"""

from __future__ import annotations

import functools
import hashlib
import shlex
import subprocess
import tempfile
import zipapp
from importlib import resources
from pathlib import Path

PACKAGE = "mift_node"  # the package's name inside the zipapp (the nodes have no launcher package)
NODE_DIR = "~/.cache/mift-node"  # where a node keeps the file (the ssh user's home)
EXTRA_VAR = "mift_node_program"  # the playbooks' view: {"src": controller path, "dest": node path}
SHIP_TIMEOUT_S = 60.0
ENTRY = f"import sys\n\nfrom {PACKAGE}.__main__ import main\n\nsys.exit(main())\n"


def sources() -> dict[str, bytes]:
    """The package's modules: file name -> bytes, in name order."""
    folder = resources.files("launcher") / "node"
    names = sorted(p.name for p in folder.iterdir() if p.name.endswith(".py"))
    return {name: (folder / name).read_bytes() for name in names}


def digest(files: dict[str, bytes]) -> str:
    """The first 16 hex digits of the SHA-256 of the names and contents (and the entry point)."""
    h = hashlib.sha256(ENTRY.encode())
    for name, data in files.items():
        h.update(f"\0{name}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()[:16]


def build(into: Path) -> Path:
    """Return ``into/mift_node-<hash>.pyz``, built unless it is there already (written atomically)."""
    files = sources()
    target = into / f"mift_node-{digest(files)}.pyz"
    if target.is_file():
        return target
    into.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=into) as tmp:
        root = Path(tmp) / "src"
        (root / PACKAGE).mkdir(parents=True)
        for name, data in files.items():
            (root / PACKAGE / name).write_bytes(data)
        (root / "__main__.py").write_text(ENTRY)
        built = Path(tmp) / target.name
        zipapp.create_archive(root, built, interpreter="/usr/bin/env python3", compressed=True)
        built.chmod(0o755)
        built.replace(target)
    return target


@functools.cache
def program_file() -> Path:
    """The node program on the controller (built once per process, cached across runs)."""
    from launcher.validation.cache import cache_root  # noqa: PLC0415

    return build(cache_root() / "node")


def node_path() -> str:
    """Where a node keeps the program (``~`` is the ssh user's home, expanded on the node)."""
    return f"{NODE_DIR}/{program_file().name}"


def extravars() -> dict[str, dict[str, str]]:
    """The playbooks' view: ``{"mift_node_program": {"src": ..., "dest": ...}}``."""
    return {EXTRA_VAR: {"src": str(program_file()), "dest": node_path()}}


def _remote(path: str) -> str:
    """``path`` for a remote shell: ``~/`` left for the shell to expand, the rest quoted."""
    if path.startswith("~/"):
        return "~/" + shlex.quote(path[2:])
    return shlex.quote(path)


def ship_over_ssh(ssh: list[str]) -> None:
    """Put the program on the node behind ``ssh`` (the prefix of an ssh command) unless it is there; raises
    OSError with the node's line when that fails."""
    dest = _remote(node_path())
    folder = _remote(NODE_DIR)
    script = f"test -s {dest} || {{ mkdir -p {folder} && cat > {dest}.$$ && mv {dest}.$$ {dest}; }}"
    try:
        done = subprocess.run(
            [*ssh, script],
            input=program_file().read_bytes(),
            capture_output=True,
            timeout=SHIP_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as err:
        raise OSError(f"sending the node program: no answer within {SHIP_TIMEOUT_S:.0f} s") from err
    if done.returncode != 0:
        lines = done.stderr.decode(errors="replace").strip().splitlines()
        raise OSError(f"sending the node program: {lines[-1] if lines else f'exit {done.returncode}'}")


def command(ssh: list[str], python: str, program: str, *args: str, ship: bool = True) -> list[str]:
    """argv of ``PROGRAM ARGS`` of the node program: through ``ssh`` (sent first unless ``ship`` is false: a
    playbook of this run sent it already), or here (``ssh`` empty)."""
    if not ssh:
        return [python, str(program_file()), program, *args]
    if ship:
        ship_over_ssh(ssh)
    return [*ssh, f"{shlex.quote(python)} {_remote(node_path())} {shlex.join([program, *args])}"]
