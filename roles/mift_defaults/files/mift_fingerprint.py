#!/usr/bin/env python3
"""Fingerprints of what provisioning put on a node, per part (rocm, stack, configs); mift_defaults role.

A part's fingerprint is a sha256 over the files, directories, Debian packages and venv distributions that
the part's roles install or write (the spec, JSON, names them). ``provision.yml`` compares it, and the digest of
the part's controller-side inputs, with what this script recorded after the last complete run of the part; a
host whose part matches both is not provisioned again for that part (docs/conventions.md, "Re-runs").

    python3 mift_fingerprint.py check SPEC_JSON                      # node: now vs recorded, every part
    python3 mift_fingerprint.py record SPEC_JSON PART INPUTS_DIGEST  # node: record one part (prints changed)
    python3 mift_fingerprint.py tree SPEC_JSON                       # controller: digest of the inputs per part

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

# files larger than this are fingerprinted by size and mtime, not content (model weights, wheels)
CONTENT_LIMIT = 1 << 20


def _walk(path: str) -> list[str]:
    if os.path.isdir(path) and not os.path.islink(path):
        out = []
        for root, dirs, files in os.walk(path):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            out.extend(os.path.join(root, f) for f in sorted(files))
        return out
    return [path]


def _add_paths(digest: "hashlib._Hash", patterns: list[str]) -> None:
    for pattern in patterns:
        matches = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
        for top in matches:
            for path in _walk(top):
                digest.update(path.encode() + b"\0")
                try:
                    st = os.stat(path)
                except OSError:
                    digest.update(b"<missing>\0")
                    continue
                digest.update(f"{st.st_mode:o}:{st.st_uid}:{st.st_gid}\0".encode())
                if st.st_size > CONTENT_LIMIT:
                    digest.update(f"{st.st_size}:{st.st_mtime_ns}\0".encode())
                    continue
                try:
                    with open(path, "rb") as fh:
                        digest.update(fh.read() + b"\0")
                except OSError as exc:  # a socket, a fifo, no permission: its type is enough
                    digest.update(f"<{type(exc).__name__}>\0".encode())


def _add_dpkg(digest: "hashlib._Hash", pattern: str) -> None:
    try:
        out = subprocess.run(
            ["dpkg-query", "-W", "-f", "${Package} ${Version} ${db:Status-Abbrev}\n"],
            capture_output=True, text=True, check=False,
        ).stdout
    except OSError:
        out = "<no dpkg-query>"
    wanted = re.compile(pattern)
    digest.update("".join(sorted(l + "\n" for l in out.splitlines() if wanted.search(l.split(" ", 1)[0]))).encode())


def _add_venv(digest: "hashlib._Hash", venv: str) -> None:
    """The venv's distributions and versions: the names of its *.dist-info / *.egg-info entries."""
    names = glob.glob(os.path.join(venv, "lib", "python*", "site-packages", "*.*-info"))
    digest.update(("\n".join(sorted(os.path.basename(n) for n in names)) or "<no venv>").encode())


def node_fingerprint(part: dict) -> str:
    digest = hashlib.sha256()
    _add_paths(digest, part.get("paths", []))
    if part.get("dpkg"):
        _add_dpkg(digest, part["dpkg"])
    for venv in part.get("venvs", []):
        _add_venv(digest, venv)
    for name in part.get("proc", []):  # e.g. the boot id: a reboot makes the part verify again
        _add_paths(digest, [name])
    return digest.hexdigest()[:24]


def _read_json(path: str) -> dict:
    try:
        with open(path) as fh:
            data = json.load(fh)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def check(spec: dict) -> dict:
    recorded = _read_json(spec["record"])
    out = {"parts": {}, "facts": {}}
    for name, part in spec["parts"].items():
        out["parts"][name] = {"now": node_fingerprint(part), "recorded": recorded.get(name)}
    for name, path in spec.get("facts", {}).items():  # recorded facts other runs compare against
        out["facts"][name] = _read_json(path)
    return out


def record(spec: dict, name: str, inputs: str) -> dict:
    path = spec["record"]
    data = _read_json(path)
    entry = {"node": node_fingerprint(spec["parts"][name]), "inputs": inputs}
    if data.get(name) == entry:
        return {"changed": False, "entry": entry}
    data[name] = entry
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".mift_fingerprint.")
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh, indent=2, sort_keys=True)
        fh.write("\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
    return {"changed": True, "entry": entry}


def tree(spec: dict) -> dict:
    out = {}
    for name, patterns in spec.items():
        digest = hashlib.sha256()
        _add_paths(digest, [p for p in patterns if p])
        out[name] = digest.hexdigest()[:24]
    return out


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in ("check", "record", "tree"):
        print(__doc__.strip().splitlines()[0], file=sys.stderr)
        return 2
    spec = json.loads(argv[1])
    if argv[0] == "check":
        result = check(spec)
    elif argv[0] == "record":
        result = record(spec, argv[2], argv[3])
    else:
        result = tree(spec)
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
