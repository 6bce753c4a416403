"""One request to the node program ``mift_node.pyz prepare`` (``launcher/node/prepare.py``) on one node, over
the ssh Ansible uses.

Tokenizing once (:mod:`launcher.transfer.tokenize_once`) and merging after a run
(:mod:`launcher.transfer.merge`) each run one
LLaMA-Factory step on one node, in the node venv's interpreter: the request goes as JSON on stdin (the
trainer's environment may hold tokens: never on a command line), the answer is the last stdout line, and what
the libraries print is kept in a log file of the run.
"""

from __future__ import annotations

import json
import subprocess
import tarfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.transfer import nodeprogram

if TYPE_CHECKING:
    from collections.abc import Mapping


def node_python(cli: str) -> str:
    """The trainer's interpreter: ``python3`` beside the node venv's ``llamafactory-cli``."""
    return str(Path(cli).parent / "python3")


def command(ssh: list[str], python: str, *args: str) -> list[str]:
    """The node program's argv: through ssh (``ssh`` the prefix; the program is sent first where it is
    missing), or here (``ssh`` empty: a local node)."""
    return nodeprogram.command(ssh, python, "prepare", *args)


def call(
    ssh: list[str], python: str, verb: str, request: Mapping[str, Any], *, log: Path, timeout_s: float
) -> dict[str, Any]:
    """Run ``verb`` with ``request`` on the node; its stderr goes to ``log``. Never raises for the node's
    failure: the answer has ``ok`` false and ``error`` one line."""
    from launcher.spec.jobspec import RESERVED_ENV  # noqa: PLC0415

    # the trainer's environment without the torchrun rendezvous: one process, no distributed start
    env = {k: v for k, v in (request.get("env") or {}).items() if k not in RESERVED_ENV}
    request = {**request, "env": env}
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as err:
        try:
            done = subprocess.run(
                command(ssh, python, verb),
                input=json.dumps(request).encode(),
                stdout=subprocess.PIPE,
                stderr=err,
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return {"ok": False, "error": f"no answer within {timeout_s:.0f} s (log: {log})"}
    lines = done.stdout.decode(errors="replace").strip().splitlines()
    try:
        answer = json.loads(lines[-1]) if lines else None
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        tail = log.read_text(errors="replace").strip().splitlines()
        why = tail[-1] if tail else f"exit {done.returncode}"
        return {"ok": False, "error": f"no answer from the node program ({why}; log: {log})"}
    return answer


def fetch_folder(ssh: list[str], folder: str, into: Path, timeout_s: float) -> None:
    """Copy a node folder here (a tar stream from the node program, files only); raises OSError."""
    into.mkdir(parents=True, exist_ok=True)
    with subprocess.Popen(
        command(ssh, "python3", "tar", folder), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    ) as proc:
        assert proc.stdout is not None
        with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
            tar.extractall(into, filter="data")
        proc.wait(timeout=timeout_s)
        if proc.returncode != 0:
            err = proc.stderr.read().decode(errors="replace").strip() if proc.stderr else ""
            raise OSError(f"copying {folder} failed: {err.splitlines()[-1] if err else proc.returncode}")
