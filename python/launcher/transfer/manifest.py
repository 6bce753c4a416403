"""What staging sends: the items a job stages, their manifests (files, sizes, digests), and the sends and
checks a node's answer asks for."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.exceptions import ConfigurationError
from launcher.node import hf_cache
from launcher.node import stage as mift_stage

if TYPE_CHECKING:
    from collections.abc import Mapping

    from launcher.spec.jobspec import StageSource
    from launcher.validation.job import LoadedJob


PROGRESS_EVERY_S = 2.0


def files(n: int) -> str:
    """``1 file``, ``3 files``."""
    return f"{n} file" if n == 1 else f"{n} files"


def human(n: float) -> str:
    """Bytes as B/kB/MB/GB (decimal)."""
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"  # pragma: no cover - the loop returns


@dataclass(frozen=True)
class StageItem:
    """One staged folder: its training-YAML key, source kind, source folder and node destination."""

    key: str  # model | dataset_dir
    kind: str  # controller | shared | hf_cache | hub
    source: str  # controller folder (controller, hf_cache, hub: the fetched snapshot) or node folder (shared)
    dest: str  # node folder: the training YAML's value

    @property
    def label(self) -> str:
        return f"stage.{self.key}.{self.kind}"


def hf_snapshot(repo: str, revision: str | None) -> tuple[Path | None, str]:
    """Return a repo's snapshot folder of ``revision`` (a ref or a commit) in the hub cache, or None, why."""
    rev = revision or "main"
    root = hf_cache.repo_folder(repo)
    if not root.is_dir():
        return None, f"{repo}: not in the Hugging Face cache {root.parent} (no {root.name})"
    snap = hf_cache.snapshot_folder(root, rev)
    if not snap.is_dir():
        return (
            None,
            f"{repo}: no snapshot of revision {rev} in {root} (no refs/{rev}, no snapshots/{rev})",
        )
    return snap, ""


# the training-YAML key each staged folder goes to
YAML_KEYS = {"model": "model_name_or_path", "dataset_dir": "dataset_dir"}


def _source_folder(spec_path: Path, key: str, source: StageSource) -> str | None:
    """The controller folder of a source (None for shared); a missing one is one line."""
    where = f"stage.{key}.{source.kind}"
    if source.kind == "shared":
        return None
    if source.kind == "hub":  # fetched once here, then a controller folder like any other
        from launcher.transfer.hub import snapshot_for  # noqa: PLC0415 - huggingface_hub only when used

        return str(snapshot_for(spec_path, key, source).path)
    if source.kind == "hf_cache":
        snap, why = hf_snapshot(str(source.hf_cache), source.revision)
        if snap is None:
            raise ConfigurationError.at(spec_path, where, why, "stage-source")
        return str(snap)
    folder = Path(str(source.controller))
    if not folder.is_dir():
        what = "not a folder" if folder.exists() else "no such folder"
        raise ConfigurationError.at(spec_path, where, f"{folder}: {what}", "stage-source")
    return str(folder)


def _item(spec_path: Path, key: str, source: StageSource, train: Mapping[str, Any]) -> StageItem:
    where = f"stage.{key}.{source.kind}"
    folder = _source_folder(spec_path, key, source)
    yaml_key = YAML_KEYS[key]
    dest = train.get(yaml_key)
    if not isinstance(dest, str) or not dest.startswith("/"):
        raise ConfigurationError.at(
            spec_path,
            where,
            f"the training YAML's {yaml_key} must be an absolute node path to stage to (it is {dest!r})",
            "stage-dest",
        )
    dest = dest.rstrip("/") or "/"
    if folder is None:
        if source.shared != dest:
            raise ConfigurationError.at(
                spec_path,
                where,
                f"{source.shared} is not the training YAML's {yaml_key} {dest}: a shared folder is read in "
                "place",
                "stage-dest",
            )
        return StageItem(key, "shared", dest, dest)
    return StageItem(key, source.kind, folder, dest)


def stage_items(job: LoadedJob) -> list[StageItem]:
    """The job's staged folders, sources checked (a missing one is one line, exit 2)."""
    return [_item(job.spec_path, key, src, job.train.data) for key, src in job.spec.stage.items()]


def manifest_digest(files: Mapping[str, Mapping[str, Any]]) -> str:
    """``sha256:<hex>`` of the manifest's canonical form (path, size, sha256 of every file, sorted)."""
    rows = [[rel, int(files[rel]["size"]), str(files[rel]["sha256"])] for rel in sorted(files)]
    return "sha256:" + hashlib.sha256(json.dumps(rows, separators=(",", ":")).encode()).hexdigest()


@dataclass(frozen=True)
class Manifest:
    """The files of one staged folder: ``{rel: {"size", "sha256"}}``."""

    item: StageItem
    files: Mapping[str, Mapping[str, Any]]

    @property
    def digest(self) -> str:
        return manifest_digest(self.files)

    @property
    def total_bytes(self) -> int:
        return sum(int(f["size"]) for f in self.files.values())

    def record(self) -> dict[str, Any]:
        """What the run record keeps (the file list goes to ``staging/<key>.manifest.json``)."""
        return {
            "key": self.item.key,
            "kind": self.item.kind,
            "source": self.item.source,
            "dest": self.item.dest,
            "digest": self.digest,
            "files": len(self.files),
            "bytes": self.total_bytes,
            **({"hub": _hub_provenance(self.item.source)} if self.item.kind == "hub" else {}),
        }


def _hub_provenance(folder: str) -> dict[str, Any] | None:
    from launcher.transfer.hub import provenance_of  # noqa: PLC0415

    return provenance_of(folder)


def controller_cache() -> mift_stage.HashCache:
    from launcher.validation.cache import cache_root  # noqa: PLC0415

    return mift_stage.HashCache(cache_root() / "stage-hashes.json")


def build_manifest(item: StageItem, cache: mift_stage.HashCache) -> Manifest:
    """Hash the controller folder of ``item`` (cached); a file written to meanwhile is refused in one line."""
    try:
        files = mift_stage.scan(Path(item.source), cache, strict=True)
    except mift_stage.ChangedWhileHashingError as err:
        raise ConfigurationError(
            f"{err.path}: checksum mismatch at the source: it changed while it was hashed (still being "
            "written?); stage again once it is complete; nothing was sent"
        ) from None
    finally:
        cache.save()
    if not files:
        raise ConfigurationError(f"{item.label}: {item.source}: no files to stage")
    return Manifest(item, files)


@dataclass(frozen=True)
class Send:
    """One file to send to one node: its destination (index into the host's dests), path and content."""

    dest: int
    rel: str
    size: int
    sha256: str
    offset: int  # bytes of a partial file the node keeps (resume)
    src: Path
    mode: int = 0o644


def to_send(manifest: Manifest, held: Mapping[str, Any], dest: int) -> list[Send]:
    """The files of ``manifest`` a node does not hold as they are (missing, other size or sha256)."""
    have = held.get("files") or {}
    parts = held.get("parts") or {}
    out = []
    for rel in sorted(manifest.files):
        want = manifest.files[rel]
        got = have.get(rel) or {}
        if got.get("size") == want["size"] and got.get("sha256") == want["sha256"]:
            continue
        partial = int(parts.get(rel) or 0)
        offset = partial if 0 < partial < int(want["size"]) else 0
        src = Path(manifest.item.source) / rel
        mode = src.stat().st_mode & 0o777 if manifest.item.kind != "shared" else 0o644
        out.append(Send(dest, rel, int(want["size"]), str(want["sha256"]), offset, src, mode))
    return out


def extra_files(manifest: Manifest, held: Mapping[str, Any]) -> list[str]:
    """Files a node holds under the destination that the manifest does not name (left in place)."""
    return sorted(set(held.get("files") or {}) - set(manifest.files))


def shared_differences(manifest: Manifest, held: Mapping[str, Any]) -> list[str]:
    """How a node's view of a shared folder differs from the first node's (the manifest)."""
    have = held.get("files") or {}
    diffs = [rel for rel in sorted(manifest.files) if dict(have.get(rel) or {}) != dict(manifest.files[rel])]
    return diffs + sorted(set(have) - set(manifest.files))


def disk_shortfall(held: Mapping[str, Mapping[str, Any]], dests: list[str], sends: list[Send]) -> str | None:
    """The first file system of a node without room for its sends (sizes rounded up to blocks), or None."""
    need: dict[int, int] = {}
    free: dict[int, tuple[int, str]] = {}
    for send in sends:
        fs = held[dests[send.dest]]
        block = int(fs.get("block") or 4096)
        more = send.size - send.offset
        need[int(fs["dev"])] = need.get(int(fs["dev"]), 0) + -(-more // block) * block
        free[int(fs["dev"])] = (int(fs["free"]), dests[send.dest])
    for dev, needed in need.items():
        avail, dest = free[dev]
        if needed > avail:
            return f"{dest}: needs {human(needed)}, {human(avail)} free on its file system"
    return None
