"""Tokenize once: one node prepares the dataset, every node gets a verified copy; a changed input, a new one.

After staging (docs/launcher.md "Tokenize once"), for a job that stages both its model and its dataset folder:
the cache key is the sha256 of what LLaMA-Factory's preprocessing result depends on (the dataset folder's
manifest digest, the sha256 of every model file but the weights — the tokenizer —, the training-YAML keys its
data pipeline reads, and the node's LLaMA-Factory, transformers and datasets versions). The controller keeps
one tokenized copy per key (``<cache root>/tokenized/<key>/`` and ``<key>.json``, written last). A key it does
not hold is made on the first node by LLaMA-Factory's own ``get_dataset`` (``mift_node.pyz prepare
tokenize``), copied here and checked file by file against the node's sha256s; then staging sends it to every
node that lacks it, to ``/var/lib/mift/tokenized/<key>``, and the shipped training YAML gets that
``tokenized_path``. Another key is another folder: a stale copy is never read.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from launcher.exceptions import JobFailedError
from launcher.transfer import nodecall
from launcher.transfer.manifest import (
    Manifest,
    StageItem,
    build_manifest,
    controller_cache,
    files,
    human,
    manifest_digest,
)
from launcher.transfer.staging import send_folders

if TYPE_CHECKING:
    import threading
    from collections.abc import Mapping

    from launcher.backends.runner import PlaybookRunner
    from launcher.engine.plan import RunPlan
    from launcher.transfer.staging import StageOutcome

KEY_FORMAT = 1
TOKENIZED_DIR_ENV = "MIFT_TOKENIZED_DIR"
TOKENIZED_ROOT = "/var/lib/mift/tokenized"
TOKENIZE_TIMEOUT_S = 6 * 3600.0
# LLaMA-Factory 0.9.5's DataArguments that change the tokenized result (tests/unit/test_tokenize_once.py
# checks that every DataArguments field is here or in IGNORED_DATA_KEYS)
DATA_KEYS = (
    "template",
    "dataset",
    "eval_dataset",
    "media_dir",
    "cutoff_len",
    "train_on_prompt",
    "mask_history",
    "streaming",
    "buffer_size",
    "mix_strategy",
    "interleave_probs",
    "preprocessing_batch_size",
    "max_samples",
    "ignore_pad_token_for_loss",
    "val_size",
    "eval_on_each_dataset",
    "packing",
    "neat_packing",
    "tool_format",
    "default_system",
    "enable_thinking",
    "preserve_thinking",
)
# DataArguments that do not: where the data is (its content is the manifest), how fast, where the result goes
IGNORED_DATA_KEYS = (
    "dataset_dir",
    "overwrite_cache",
    "preprocessing_num_workers",
    "eval_num_beams",
    "tokenized_path",
    "data_shared_file_system",
)
# the tokenizer's and processor's ModelArguments, and the training arguments the pipeline reads
OTHER_KEYS = (
    "stage",
    "seed",
    "do_train",
    "do_eval",
    "do_predict",
    "predict_with_generate",
    "use_fast_tokenizer",
    "resize_vocab",
    "split_special_tokens",
    "add_tokens",
    "add_special_tokens",
    "new_special_tokens_config",
    "model_revision",
    "trust_remote_code",
    "model_max_length",
    "image_max_pixels",
    "image_min_pixels",
    "image_do_pan_and_scan",
    "crop_to_patches",
    "video_max_pixels",
    "video_min_pixels",
    "video_fps",
    "video_maxlen",
    "use_audio_in_video",
    "audio_sampling_rate",
)
KEY_PACKAGES = ("llamafactory", "transformers", "datasets", "tokenizers")
# model files that are weights: they do not change the tokenizer (every other file of the folder does count)
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".ckpt", ".h5", ".msgpack", ".index.json")
# LLaMA-Factory's stage -> the stage its get_dataset takes
DATA_STAGE = {"dpo": "rm", "orpo": "rm", "simpo": "rm"}


def skip_reason(stage_keys: list[str], train: Mapping[str, Any], enabled: bool) -> str | None:
    """Why a job does not tokenize once (None: it does)."""
    if not enabled:
        return "stage.tokenize_once is false"
    if "model" not in stage_keys or "dataset_dir" not in stage_keys:
        return (
            "the job does not stage both its model and its dataset_dir (the key is made of their manifests)"
        )
    if train.get("tokenized_path"):
        return f"the training YAML sets tokenized_path ({train['tokenized_path']}): it is used as written"
    if train.get("streaming"):
        return "the training YAML streams its dataset (LLaMA-Factory saves no tokenized copy when streaming)"
    return None


def tokenizer_files(model: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """The model folder's files but its weights: rel -> sha256."""
    return {rel: str(model[rel]["sha256"]) for rel in sorted(model) if not rel.endswith(WEIGHT_SUFFIXES)}


def key_inputs(
    train: Mapping[str, Any],
    dataset: Mapping[str, Mapping[str, Any]],
    model: Mapping[str, Mapping[str, Any]],
    versions: Mapping[str, Any],
) -> dict[str, Any]:
    """What the tokenized result depends on, as JSON data (``train``: the training YAML as shipped)."""
    return {
        "format": KEY_FORMAT,
        "dataset": manifest_digest(dataset),
        "tokenizer": tokenizer_files(model),
        "train": {k: train[k] for k in (*DATA_KEYS, *OTHER_KEYS) if k in train},
        "versions": {k: str(versions[k]) for k in KEY_PACKAGES if versions.get(k) is not None},
    }


def cache_key(inputs: Mapping[str, Any]) -> str:
    """The key: the first 32 hex digits of the sha256 of the inputs' canonical JSON."""
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:32]


def changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """What differs between two keys' inputs, one short phrase each (``cutoff_len 64 -> 32``)."""
    out = []
    if old.get("dataset") != new.get("dataset"):
        out.append(f"dataset files {str(old.get('dataset'))[:19]} -> {str(new.get('dataset'))[:19]}")
    o_tok, n_tok = old.get("tokenizer") or {}, new.get("tokenizer") or {}
    for rel in sorted(set(o_tok) | set(n_tok)):
        if o_tok.get(rel) != n_tok.get(rel):
            out.append(
                f"model file {rel} " + ("changed" if rel in o_tok and rel in n_tok else "added/removed")
            )
    o_train, n_train = old.get("train") or {}, new.get("train") or {}
    for k in sorted(set(o_train) | set(n_train)):
        if o_train.get(k) != n_train.get(k):
            out.append(f"{k} {o_train.get(k, '(unset)')} -> {n_train.get(k, '(unset)')}")
    o_ver, n_ver = old.get("versions") or {}, new.get("versions") or {}
    out += [
        f"{k} {o_ver.get(k)} -> {n_ver.get(k)}"
        for k in sorted(set(o_ver) | set(n_ver))
        if o_ver.get(k) != n_ver.get(k)
    ]
    return out


def cache_folder() -> Path:
    """The controller's tokenized copies: ``$MIFT_TOKENIZED_DIR``, else ``<cache root>/tokenized``."""
    from launcher.validation.cache import cache_root  # noqa: PLC0415

    return Path(os.environ.get(TOKENIZED_DIR_ENV) or cache_root() / "tokenized")


@dataclass(frozen=True)
class Held:
    """A tokenized copy the controller holds: its folder and record (``<key>.json``)."""

    folder: Path
    record: Mapping[str, Any]


def held(key: str, root: Path) -> Held | None:
    """The controller's copy of ``key`` when it is complete and unchanged since it was checked, else None."""
    try:
        record = json.loads((root / f"{key}.json").read_text())
    except (OSError, ValueError):
        return None
    folder = root / key
    if not folder.is_dir() or not isinstance(record, dict) or not isinstance(record.get("files"), dict):
        return None
    return Held(folder, record)


def last_inputs(root: Path) -> dict[str, Any] | None:
    """The inputs of the copy made last (to say what changed), or None."""
    records = sorted(root.glob("*.json"), key=lambda p: p.stat().st_mtime) if root.is_dir() else []
    for path in reversed(records):
        try:
            return dict(json.loads(path.read_text())["inputs"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return None


@dataclass(frozen=True)
class NodeSide:
    """How the first node is reached and runs LLaMA-Factory."""

    host: str
    ssh: list[str]
    python: str
    env: Mapping[str, str]


def _verify(folder: Path, want: Mapping[str, Mapping[str, Any]]) -> str | None:
    from launcher.node import stage as mift_stage  # noqa: PLC0415

    got = mift_stage.scan(folder, mift_stage.HashCache(None), strict=True)
    if set(got) != set(want):
        return f"the copy holds {files(len(got))}, the node listed {files(len(want))}"
    for rel, meta in want.items():
        if got[rel]["sha256"] != meta["sha256"] or got[rel]["size"] != meta["size"]:
            return f"{rel}: sha256 differs from the node's"
    return None


def make(
    key: str,
    *,
    inputs: Mapping[str, Any],
    train: Mapping[str, Any],
    node: NodeSide,
    logs: Path,
    run_id: str,
    out: IO[str],
) -> Held:
    """Tokenize on the node (or take the copy it already holds), copy it here, check it, keep it."""
    root = cache_folder()
    dest = f"{TOKENIZED_ROOT}/{key}"
    stage = str(train.get("stage") or "sft")
    request = {
        "env": dict(node.env),
        "args": dict(train),
        "dest": dest,
        "stage": DATA_STAGE.get(stage, stage),
    }
    log = logs / f"{node.host}.log"
    answer = nodecall.call(node.ssh, node.python, "tokenize", request, log=log, timeout_s=TOKENIZE_TIMEOUT_S)
    if not answer.get("ok"):
        raise JobFailedError(f"{node.host}: tokenizing failed: {answer.get('error')} (log: {log})")
    node_files = answer["files"]
    size = sum(int(f["size"]) for f in node_files.values())
    if answer.get("tokenized"):
        print(
            f"tokenize: {node.host} tokenized the dataset in {answer.get('seconds')} s: "
            f"{files(len(node_files))}, {human(size)} (key {key[:12]})",
            file=out,
            flush=True,
        )
    else:
        print(f"tokenize: {node.host} already held key {key[:12]}: not tokenized again", file=out, flush=True)
    part = root / f".{key}.part"
    shutil.rmtree(part, ignore_errors=True)
    try:
        nodecall.fetch_folder(node.ssh, dest, part, timeout_s=TOKENIZE_TIMEOUT_S)
        why = _verify(part, node_files)
    except OSError as err:
        why = str(err)
    if why:
        shutil.rmtree(part, ignore_errors=True)
        raise JobFailedError(f"{node.host}: {dest}: the tokenized copy did not arrive intact: {why}")
    shutil.rmtree(root / key, ignore_errors=True)
    part.rename(root / key)
    record = {
        "key": key,
        "inputs": dict(inputs),
        "files": node_files,
        "digest": manifest_digest(node_files),
        "tokenized_by": {"run_id": run_id, "host": node.host, "seconds": answer.get("seconds")},
        "created_at": time.time(),
    }
    (root / f".{key}.json.part").write_text(json.dumps(record, indent=1) + "\n")
    (root / f".{key}.json.part").rename(root / f"{key}.json")
    return Held(root / key, record)


def manifest_of(key: str, copy: Held) -> Manifest | None:
    """The staging manifest of the controller's copy, re-hashed (cached); None when it no longer matches."""
    item = StageItem("tokenized", "controller", str(copy.folder), f"{TOKENIZED_ROOT}/{key}")
    try:
        manifest = build_manifest(item, controller_cache())
    except Exception:
        return None
    return manifest if manifest.digest == copy.record.get("digest") else None


def tokenize_for_run(
    plan: RunPlan,
    runner: PlaybookRunner,
    outcome: StageOutcome,
    logs: Path,
    *,
    train: Mapping[str, Any],
    out: IO[str],
    stop: threading.Event,
) -> tuple[str, dict[str, Any]] | None:
    """Make every node hold the tokenized dataset of this run's key; return its node path (the run's
    ``tokenized_path``) and what the record keeps, or None when the job does not tokenize once. ``train``:
    the training YAML as shipped."""
    spec = plan.spec
    why = skip_reason([m.item.key for m in outcome.manifests], train, spec.stage.tokenize_once)
    if why is not None:
        if spec.stage.tokenize_once and outcome.manifests:
            print(f"note: tokenize once: not done: {why}", file=out, flush=True)
        return None
    t0 = time.monotonic()
    by_key = {m.item.key: m for m in outcome.manifests}
    first = plan.hosts[0]
    stack = plan.facts.stack.get(first) or {}
    versions = stack.get("versions") if isinstance(stack.get("versions"), dict) else {}
    inputs = key_inputs(train, by_key["dataset_dir"].files, by_key["model"].files, versions or {})
    key = cache_key(inputs)
    root = cache_folder()
    root.mkdir(parents=True, exist_ok=True)
    copy = held(key, root)
    manifest = manifest_of(key, copy) if copy is not None else None
    if manifest is not None and copy is not None:
        by = copy.record.get("tokenized_by") or {}
        print(
            f"tokenize: key {key[:12]} held here (tokenized by {by.get('run_id')} on {by.get('host')}): "
            "not tokenized again",
            file=out,
            flush=True,
        )
        made = False
    else:
        previous = last_inputs(root)
        what = "; ".join(changes(previous, inputs)) if previous else "no tokenized copy here yet"
        if copy is not None:
            what = "its copy here no longer matches its record"
        print(f"tokenize: key {key[:12]} is new ({what or 'same inputs'})", file=out, flush=True)
        if first not in outcome.connections:
            raise JobFailedError(f"{first}: staging did not say how it is reached; nothing tokenized")
        node = NodeSide(
            first,
            outcome.connections[first],
            nodecall.node_python(str(plan.jobs[first]["argv"][0])),
            plan.envs.get(first) or {},
        )
        copy = make(key, inputs=inputs, train=train, node=node, logs=logs, run_id=plan.run_id, out=out)
        manifest = manifest_of(key, copy)
        if manifest is None:
            raise JobFailedError(f"{root / key}: the tokenized copy changed right after it was checked")
        made = True
    sent = send_folders(runner, spec.host_pattern, [manifest], spec.stage.node_cache, out=out, stop=stop)
    dest = manifest.item.dest
    return dest, {
        "key": key,
        "path": dest,
        "digest": manifest.digest,
        "files": len(manifest.files),
        "bytes": manifest.total_bytes,
        "tokenized": made,
        "tokenized_by": (copy.record.get("tokenized_by") if copy else None),
        "sent": sent,
        "seconds": round(time.monotonic() - t0, 2),
        "inputs": inputs,
    }
