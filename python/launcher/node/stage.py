#!/usr/bin/env python3
"""Staging on a node: what a node holds of a staged folder, and receiving the files that differ.

Standard library only. The launcher (``launcher.staging``) imports it for the one hashing code (the
controller's manifest is made by :func:`scan` too) and runs it on the nodes:

    python3 mift_node.pyz stage report [--cache FILE] DEST...
        one JSON object: per DEST the files held (size, sha256), leftover partial files, free bytes and the
        file system (device id, block size) of DEST or its nearest existing parent
    python3 mift_node.pyz stage recv [--cache FILE] DEST... < stream
        the stream: a JSON header line per file {"dest": i, "path": REL, "size": N, "sha256": H, "offset": O,
        "mode": M} followed by its N - O bytes; {"end": true} ends it. Each file is written to
        ``.<name>.mift-part`` beside its final name (appended to from ``offset`` when a partial file is
        resumed), hashed while written, and renamed to its name only when size and sha256 match: a file with a
        final name is always complete. One JSON line per file on stdout; exit 3 when the disk filled (the
        partial file is removed), 0 otherwise (a checksum mismatch is reported on its line, nothing written).

Hashes are cached per file in a JSON file keyed by the path and (size, mtime, ctime, inode), so a 140 GB model
is hashed once, not on every run: any write to a file changes its ctime, which a user cannot set back.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import IO, Any

PART_SUFFIX = ".mift-part"
CHUNK = 1 << 20
DEFAULT_CACHE = "/var/lib/mift/stage-hashes.json"
DISK_FULL_RC = 3


class ChangedWhileHashingError(Exception):
    """A file's size, mtime or ctime changed while it was read: its hash describes no version of it."""

    def __init__(self, path: Path) -> None:
        super().__init__(f"{path}: changed while it was hashed (written to during staging?)")
        self.path = path


def stat_key(st: os.stat_result) -> list[int]:
    """What a cached hash is valid for: size, mtime, ctime (ns) and inode."""
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


class HashCache:
    """sha256 per file, valid while the file's :func:`stat_key` is unchanged; a JSON file."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.entries: dict[str, list[Any]] = {}
        self.dirty = False
        if path is not None:
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError):
                data = {}
            self.entries = data if isinstance(data, dict) else {}

    def get(self, path: Path, st: os.stat_result) -> str | None:
        entry = self.entries.get(str(path))
        if isinstance(entry, list) and len(entry) == 5 and entry[:4] == stat_key(st):
            return str(entry[4])
        return None

    def put(self, path: Path, st: os.stat_result, sha: str) -> None:
        self.entries[str(path)] = [*stat_key(st), sha]
        self.dirty = True

    def prune(self, root: Path, keep: set[str]) -> None:
        """Forget the files under ``root`` that are not in ``keep`` (deleted or renamed since)."""
        prefix = f"{root}/"
        gone = [k for k in self.entries if k.startswith(prefix) and k not in keep]
        for key in gone:
            del self.entries[key]
        self.dirty = self.dirty or bool(gone)

    def save(self) -> None:
        """Write the cache (atomically); a cache that cannot be written is only slower next time."""
        if self.path is None or not self.dirty:
            return
        with contextlib.suppress(OSError):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(self.entries))
            tmp.replace(self.path)
            self.dirty = False


def hash_file(path: Path, cache: HashCache) -> str:
    """Return the sha256 of ``path`` (cached); raise :class:`ChangedWhileHashingError` when it changed
    meanwhile."""
    before = path.stat()
    known = cache.get(path, before)
    if known is not None:
        return known
    digest = hashlib.sha256()
    read = 0
    with path.open("rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
            read += len(chunk)
        after = os.fstat(fh.fileno())
    if stat_key(after)[:3] != stat_key(before)[:3] or read != after.st_size:
        raise ChangedWhileHashingError(path)
    sha = digest.hexdigest()
    cache.put(path, after, sha)
    return sha


def is_part(name: str) -> bool:
    return name.startswith(".") and name.endswith(PART_SUFFIX)


def part_name(rel: str) -> str:
    """The partial file of ``rel``: ``dir/.name.mift-part``."""
    head, _, name = rel.rpartition("/")
    return f"{head}/.{name}{PART_SUFFIX}" if head else f".{name}{PART_SUFFIX}"


def walk(root: Path) -> tuple[dict[str, Path], dict[str, Path]]:
    """Return the regular files under ``root`` (symlinks followed: a Hugging Face snapshot is links into
    ``blobs/``) and the partial files, both by path relative to ``root``."""
    files: dict[str, Path] = {}
    parts: dict[str, Path] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        dirnames.sort()
        for name in sorted(filenames):
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            if is_part(name):
                parts[rel] = path
            elif path.is_file():
                files[rel] = path
    return files, parts


def scan(root: Path, cache: HashCache, *, strict: bool) -> dict[str, dict[str, Any]]:
    """Return ``{rel: {"size", "sha256"}}`` of every file under ``root``.

    ``strict`` (the controller's manifest): a file that changed while hashed raises; otherwise (a node's
    report) its sha256 is None, so it is sent again.
    """
    files, _ = walk(root)
    out: dict[str, dict[str, Any]] = {}
    for rel, path in files.items():
        try:
            sha: str | None = hash_file(path, cache)
        except ChangedWhileHashingError:
            if strict:
                raise
            sha = None
        out[rel] = {"size": path.stat().st_size, "sha256": sha}
    cache.prune(root, {str(p) for p in files.values()})
    return out


def _fs_of(path: Path) -> dict[str, int]:
    """Device id, free bytes and block size of the file system of ``path`` (or of its nearest parent)."""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    vfs = os.statvfs(probe)
    free = vfs.f_bavail * vfs.f_frsize
    return {"dev": probe.stat().st_dev, "free": free, "block": vfs.f_frsize or 4096, "inodes": vfs.f_favail}


def report(dests: list[str], cache: HashCache) -> dict[str, Any]:
    """What this node holds under each of ``dests``."""
    out: dict[str, Any] = {}
    for dest in dests:
        root = Path(dest)
        entry: dict[str, Any] = {"exists": root.is_dir(), "files": {}, "parts": {}, **_fs_of(root)}
        if root.is_dir():
            entry["files"] = scan(root, cache, strict=False)
            entry["parts"] = {_final_of(rel): p.stat().st_size for rel, p in walk(root)[1].items()}
        out[dest] = entry
    cache.save()
    return out


def _final_of(part_rel: str) -> str:
    """The final name of a partial file: ``dir/.name.mift-part`` -> ``dir/name``."""
    head, _, name = part_rel.rpartition("/")
    final = name[1 : -len(PART_SUFFIX)]
    return f"{head}/{final}" if head else final


def _safe_rel(rel: object) -> str:
    if not isinstance(rel, str) or not rel or rel.startswith("/") or ".." in rel.split("/"):
        raise ValueError(f"refusing path {rel!r}")
    return rel


def _read_exact(stream: IO[bytes], size: int, sink: Any) -> int:  # noqa: ANN401 - a callable taking bytes
    """Read ``size`` bytes from ``stream`` into ``sink``; return how many arrived (less: the stream ended)."""
    got = 0
    while got < size:
        chunk = stream.read(min(CHUNK, size - got))
        if not chunk:
            break
        sink(chunk)
        got += len(chunk)
    return got


def _resume_digest(part: Path, offset: int) -> hashlib._Hash | None:
    """The sha256 state of a partial file's first ``offset`` bytes (None when it has fewer)."""
    digest = hashlib.sha256()
    try:
        with part.open("rb") as fh:
            if _read_exact(fh, offset, digest.update) != offset:
                return None
    except OSError:
        return None
    return digest


def _drain(stream: IO[bytes], size: int) -> None:
    _read_exact(stream, size, lambda _chunk: None)


def receive_one(root: Path, header: dict[str, Any], stream: IO[bytes], cache: HashCache) -> dict[str, Any]:
    """Receive one file of the stream under ``root``; return its result line (OSError ENOSPC: disk full).

    The partial file is locked (``flock``) from before its first byte is written until it is renamed: a second
    staging of the same folder at the same time gets an error line and writes nothing, so no file is renamed
    into place holding bytes another writer put there.
    """
    rel = _safe_rel(header["path"])
    size, offset = int(header["size"]), int(header.get("offset") or 0)
    final = root / rel
    part = root / part_name(rel)
    final.parent.mkdir(parents=True, exist_ok=True)
    digest = _resume_digest(part, offset) if offset else hashlib.sha256()
    if digest is None:  # the partial file to resume is gone or shorter: drain, the next run sends it whole
        _drain(stream, size - offset)
        part.unlink(missing_ok=True)
        return {"path": rel, "ok": False, "error": "partial file to resume from is gone; sent again next run"}
    try:
        fd = os.open(part, os.O_WRONLY | os.O_CREAT, 0o600)  # not O_TRUNC: only once the lock is ours
        with os.fdopen(fd, "wb") as out:
            try:
                fcntl.flock(out.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                _drain(stream, size - offset)
                return {"path": rel, "ok": False, "error": "another staging is writing this file now"}
            out.truncate(offset)
            out.seek(offset)

            def sink(chunk: bytes) -> None:
                out.write(chunk)
                digest.update(chunk)

            got = _read_exact(stream, size - offset, sink)
            out.flush()
            os.fsync(out.fileno())
            sha = digest.hexdigest()
            if got != size - offset or sha != header["sha256"]:
                part.unlink(missing_ok=True)
                why = (
                    "stream ended early"
                    if got != size - offset
                    else f"sha256 {sha[:12]} != manifest {header['sha256'][:12]}"
                )
                return {
                    "path": rel,
                    "ok": False,
                    "error": f"checksum mismatch ({why}): not written",
                    "sha256": sha,
                }
            os.fchmod(out.fileno(), int(header.get("mode") or 0o644) & 0o777)
            part.replace(final)  # still locked: nobody wrote to it since it was hashed
    except OSError as err:
        if err.errno == errno.ENOSPC:
            part.unlink(missing_ok=True)
        raise
    cache.put(final, final.stat(), sha)
    return {"path": rel, "ok": True, "bytes": size - offset}


def receive(roots: list[Path], stream: IO[bytes], out: IO[str], cache: HashCache) -> int:
    """Receive files until the end header; return the exit code (:data:`DISK_FULL_RC`: the disk filled)."""
    try:
        while line := stream.readline():
            header = json.loads(line)
            if header.get("end"):
                break
            root = roots[int(header["dest"])]
            try:
                result = receive_one(root, header, stream, cache)
            except OSError as err:
                if err.errno != errno.ENOSPC:
                    raise
                full = {"dest": header["dest"], "path": header["path"], "ok": False, "error": "disk full"}
                print(json.dumps({**full, **_fs_of(root)}), file=out)
                out.flush()
                return DISK_FULL_RC
            print(json.dumps({"dest": header["dest"], **result}), file=out)
            out.flush()
    finally:
        cache.save()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mift_stage.py")
    parser.add_argument("command", choices=("report", "recv"))
    parser.add_argument("dests", nargs="*")  # report with none: the node's connection only (launcher.merge)
    parser.add_argument("--cache", default=DEFAULT_CACHE)
    args = parser.parse_intermixed_args(argv)  # the optional dests may follow --cache
    cache = HashCache(Path(args.cache) if args.cache else None)
    if args.command == "recv" and not args.dests:
        parser.error("recv needs at least one destination")
    if args.command == "report":
        print(json.dumps(report(args.dests, cache)))
        return 0
    return receive([Path(d) for d in args.dests], sys.stdin.buffer, sys.stdout, cache)


if __name__ == "__main__":
    sys.exit(main())
