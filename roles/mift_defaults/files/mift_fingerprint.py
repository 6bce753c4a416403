#!/usr/bin/env python3
"""Fingerprints of what provisioning put on a node, per part (rocm, stack, configs); mift_defaults role.

A part's fingerprint is a sha256 over the files, directories, Debian packages and venv distributions that
the part's roles install or write (the spec, JSON, names them). ``provision.yml`` compares it, and the digest
of the part's controller-side inputs, with what this script recorded after the last complete run of the part;
a host whose part matches both is not provisioned again for that part (docs/conventions.md, "Re-runs").

    python3 mift_fingerprint.py check SPEC_JSON                      # node: now and recorded, every part
    python3 mift_fingerprint.py record SPEC_JSON PART INPUTS_DIGEST  # node: record one part (prints changed)
    python3 mift_fingerprint.py tree SPEC_JSON                       # controller: digest of inputs per part

Standard library only, Python 3.8+: it runs with the node's system python3 before any venv exists.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Protocol

# files larger than this are fingerprinted by size and mtime, not content (model weights, wheels)
CONTENT_LIMIT = 1 << 20


class _Digest(Protocol):
    def update(self, data: bytes, /) -> None: ...


def _walk(path: Path) -> list[Path]:
    if path.is_dir() and not path.is_symlink():
        out: list[Path] = []
        for root, dirs, files in os.walk(path):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            out.extend(Path(root) / f for f in sorted(files))
        return out
    return [path]


def _expand(pattern: str) -> list[Path]:
    if glob.has_magic(pattern):
        return sorted(Path(p) for p in glob.glob(pattern))  # noqa: PTH207 - absolute patterns
    return [Path(pattern)]


def _add_paths(digest: _Digest, patterns: list[str]) -> None:
    for pattern in patterns:
        for top in _expand(pattern):
            for path in _walk(top):
                digest.update(str(path).encode() + b"\0")
                try:
                    st = path.stat()
                except OSError:
                    digest.update(b"<missing>\0")
                    continue
                digest.update(f"{st.st_mode:o}:{st.st_uid}:{st.st_gid}\0".encode())
                if st.st_size > CONTENT_LIMIT:
                    digest.update(f"{st.st_size}:{st.st_mtime_ns}\0".encode())
                    continue
                try:
                    digest.update(path.read_bytes() + b"\0")
                except OSError as exc:  # a socket, a fifo, no permission: its type is enough
                    digest.update(f"<{type(exc).__name__}>\0".encode())


def _add_dpkg(digest: _Digest, pattern: str) -> None:
    try:
        out = subprocess.run(
            ["dpkg-query", "-W", "-f", "${Package} ${Version} ${db:Status-Abbrev}\n"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
    except OSError:
        out = "<no dpkg-query>"
    wanted = re.compile(pattern)
    lines = sorted(line for line in out.splitlines() if wanted.search(line.split(" ", 1)[0]))
    digest.update("\n".join(lines).encode())


def _add_venv(digest: _Digest, venv: str) -> None:
    """The venv's distributions and versions: the names of its *.dist-info / *.egg-info entries."""
    names = sorted(p.name for p in Path(venv).glob("lib/python*/site-packages/*.*-info"))
    digest.update(("\n".join(names) or "<no venv>").encode())


def node_fingerprint(part: dict[str, Any]) -> str:
    digest = hashlib.sha256()
    _add_paths(digest, part.get("paths", []))
    if part.get("dpkg"):
        _add_dpkg(digest, part["dpkg"])
    for venv in part.get("venvs", []):
        _add_venv(digest, venv)
    return digest.hexdigest()[:24]


def _read_json(path: str) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def check(spec: dict[str, Any]) -> dict[str, Any]:
    recorded = _read_json(spec["record"])
    parts = {
        name: {"now": node_fingerprint(part), "recorded": recorded.get(name)}
        for name, part in spec["parts"].items()
    }
    # recorded facts a run compares against (stack_check: a new node against the others' stacks)
    facts = {name: _read_json(path) for name, path in spec.get("facts", {}).items()}
    return {"parts": parts, "facts": facts}


def record(spec: dict[str, Any], name: str, inputs: str) -> dict[str, Any]:
    path = Path(spec["record"])
    data = _read_json(str(path))
    entry = {"node": node_fingerprint(spec["parts"][name]), "inputs": inputs}
    if data.get(name) == entry:
        return {"changed": False, "entry": entry}
    data[name] = entry
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".mift_fingerprint.")
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh, indent=2, sort_keys=True)
        fh.write("\n")
    Path(tmp).chmod(0o644)
    Path(tmp).replace(path)
    return {"changed": True, "entry": entry}


def tree(spec: dict[str, list[str]]) -> dict[str, str]:
    out = {}
    for name, patterns in spec.items():
        digest = hashlib.sha256()
        _add_paths(digest, [p for p in patterns if p])
        out[name] = digest.hexdigest()[:24]
    return out


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in ("check", "record", "tree"):
        print("usage: mift_fingerprint.py check|record|tree SPEC_JSON [PART INPUTS]", file=sys.stderr)
        return 2
    spec = json.loads(argv[1])
    if argv[0] == "check":
        result: dict[str, Any] = check(spec)
    elif argv[0] == "record":
        result = record(spec, argv[2], argv[3])
    else:
        result = dict(tree(spec))
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
