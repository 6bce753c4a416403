"""What the job's paths need on a node, as the probe checks them (standard library only): the checkpoints of
the output folder, the model, adapter and dataset files the training YAML names, a hub id's complete snapshot
in the node's Hugging Face cache (the trainers run offline).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from .hf_cache import repo_folder, snapshot_folder

# the Trainer writes trainer_state.json after the weights, optimizer, scheduler and RNG states of a
# checkpoint: a checkpoint-N folder without it was cut short (a stop while saving) and cannot be resumed from
COMPLETE_MARKER = "trainer_state.json"


def checkpoints(path: Path) -> list[int]:
    """Return the steps of the complete ``checkpoint-N`` folders in ``path``, ascending."""
    found = []
    try:
        entries = list(path.iterdir())
    except OSError:
        return []
    for entry in entries:
        match = re.fullmatch(r"checkpoint-(\d+)", entry.name)
        if match and entry.is_dir() and (entry / COMPLETE_MARKER).is_file():
            found.append(int(match.group(1)))
    return sorted(found)


# LLaMA-Factory's dataset_info.json entries that are not files in dataset_dir (hub, script, cloud)
REMOTE_DATASET_KEYS = ("hf_hub_url", "ms_hub_url", "om_hub_url", "script_url", "cloud_file_name")


def _first_match(folder: Path, patterns: list[str]) -> Path | None:
    for pattern in patterns:
        found = sorted(folder.glob(pattern))
        if found:
            return found[0]
    return None


def _index_gap(index: Path) -> str | None:
    """Return the first shard a ``*.index.json`` names that is not next to it (None: all there)."""
    try:
        weight_map = json.loads(index.read_text()).get("weight_map")
    except (OSError, ValueError, AttributeError):
        return f"{index.name}: not a readable weights index"
    if not isinstance(weight_map, dict) or not weight_map:
        return f"{index.name}: names no weight files"
    for shard in sorted({str(v) for v in weight_map.values()}):
        if not (index.parent / shard).is_file():
            return f"{shard} (named by {index.name}) missing"
    return None


def _dataset_gaps(folder: Path, names: list[str]) -> list[str]:
    """Return what LLaMA-Factory would not find: an entry of dataset_info.json, an entry's local file."""
    try:
        info = json.loads((folder / "dataset_info.json").read_text())
    except (OSError, ValueError):
        return []  # reported by the dataset_info.json requirement itself
    if not isinstance(info, dict):
        return ["dataset_info.json: not a JSON object"]
    gaps = []
    for name in names:
        entry = info.get(name)
        if not isinstance(entry, dict):
            gaps.append(f"dataset {name!r} not in dataset_info.json")
        elif (
            isinstance(entry.get("file_name"), str)
            and not any(entry.get(k) for k in REMOTE_DATASET_KEYS)
            and not (folder / entry["file_name"]).exists()
        ):
            gaps.append(f"{name}: {folder / entry['file_name']} missing")
    return gaps


def hub_snapshot(repo: str, cache: object = None, revision: str = "main") -> tuple[Path | None, str]:
    """The complete snapshot of ``repo`` the node's cache holds for ``revision`` (what transformers opens with
    HF_HUB_OFFLINE=1), or None and why not: no repo folder, no ref, no snapshot, a download left unfinished
    (``blobs/*.incomplete``) or a file whose blob is gone."""
    root = repo_folder(repo, cache)
    offline = "the nodes run offline (HF_HUB_OFFLINE=1): stage it (stage.model in the job spec)"
    if not root.is_dir():
        return None, f"not staged and not in this node's Hugging Face cache ({root} missing); {offline}"
    snap = snapshot_folder(root, revision)
    if not snap.is_dir():
        return None, f"no snapshot of {revision} in {root}; {offline}"
    unfinished = sorted(p.name for p in (root / "blobs").glob("*.incomplete"))
    broken = sorted(str(p.relative_to(snap)) for p in snap.rglob("*") if p.is_symlink() and not p.exists())
    if unfinished or broken:
        what = f"{len(unfinished)} unfinished download(s)" if unfinished else f"{broken[0]} has no blob"
        return None, f"incomplete in {root} ({what}); {offline}"
    return snap, ""


def missing_paths(run_dir: Path, requirements: object) -> list[dict[str, str]]:
    """Return one ``{what, path, why}`` per node path the job needs that is absent or incomplete here.

    Each requirement: ``what`` (the key that names it), ``path`` (relative: in the run directory, the
    trainer's working directory), ``files`` (groups of glob patterns: one of each group must be in the
    folder; a match ending in ``.index.json`` needs the shards it names), ``datasets`` (names that
    dataset_info.json must list, with their local files), ``hub`` (a hub id: the folder is its complete
    snapshot in the node's Hugging Face cache, ``cache`` when the job's environment names one).
    """
    if not isinstance(requirements, list) or not all(isinstance(r, dict) for r in requirements):
        return [{"what": "--require", "path": "", "why": "not a JSON list of objects"}]
    out = []
    for req in requirements:
        # lexically: the new run directory does not exist yet, so the kernel could not walk "../" out of it
        folder = Path(os.path.normpath(run_dir / str(req.get("path", ""))))
        why = ""
        if req.get(
            "hub"
        ):  # a hub id: the trainer runs offline, so its snapshot must be complete in the cache
            snapshot, why = hub_snapshot(
                str(req["hub"]), req.get("cache"), str(req.get("revision") or "main")
            )
            if snapshot is None:
                out.append({"what": str(req.get("what", "")), "path": str(req["hub"]), "why": why})
                continue
            folder = snapshot
        if not folder.exists():
            why = "no such directory"
        elif not folder.is_dir():
            why = "not a directory"
        else:
            gaps = []
            for group in req.get("files") or []:
                found = _first_match(folder, [str(g) for g in group])
                if found is None:
                    gaps.append(" or ".join(str(g) for g in group) + " missing")
                elif found.name.endswith(".index.json"):
                    gaps.extend(g for g in [_index_gap(found)] if g)
            gaps.extend(_dataset_gaps(folder, [str(n) for n in req.get("datasets") or []]))
            why = "; ".join(gaps)
        if why:
            out.append({"what": str(req.get("what", "")), "path": str(folder), "why": why})
    return out
