"""After a successful run: merge the LoRA adapter into the base model on one node, check it, record it.

docs/launcher.md "Merge after the run": on the node the job spec names (default: the node that saved the
adapter, rank 0), ``mift_node.pyz prepare merge`` runs LLaMA-Factory's export (``llamafactory-cli export``:
``export_device`` cpu or auto) into ``/var/lib/mift/runs/<run_id>/merged`` (a partial folder renamed when
complete), then the smoke check: the greedy tokens of the merged model and of the base model with the adapter
applied (peft, not merged) on a few prompts, same dtype and device. The answer, the merged folder's manifest
(size and sha256 per file) and the tokens are kept in the run: ``merge/result.json``, ``merge/<host>.log``,
``merge`` in record.json.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from launcher.exceptions import JobFailedError
from launcher.spec.nodelayout import layout
from launcher.transfer import nodecall

if TYPE_CHECKING:
    from collections.abc import Mapping

    from launcher.backends.runner import PlaybookRunner
    from launcher.engine.plan import RunPlan
    from launcher.rundir.runs import RunDir
    from launcher.spec.jobspec import MergeOptions

MERGED_DIR = "merged"
ADAPTER_FILE = "adapter_model.safetensors"


def wanted(options: MergeOptions, stages_model: bool, train: Mapping[str, Any]) -> tuple[bool, str]:
    """Whether the run merges, and why not (a note when the job spec asked for it)."""
    lora = str(train.get("finetuning_type") or "lora") == "lora"
    if options.enabled is False:
        return False, ""
    if not lora:
        return False, f"finetuning_type is {train.get('finetuning_type')}: no adapter to merge"
    if not train.get("do_train", False):
        return False, "the training YAML does not train (do_train is not true)"
    if options.enabled is None and not stages_model:
        return False, ""
    return True, ""


def adapter_holders(outputs: Mapping[str, Any]) -> dict[str, str]:
    """host -> its final adapter folder (output_dir's, not a checkpoint's), from the collected outputs."""
    found = {}
    for host, paths in outputs.items():
        for path in paths if isinstance(paths, list) else []:
            p = Path(str(path))
            if p.name == ADAPTER_FILE and not p.parent.name.startswith("checkpoint-"):
                found[host] = str(p.parent)
                break
    return found


def first_difference(rows: list[Mapping[str, Any]]) -> str | None:
    """The first prompt whose merged and base + adapter tokens differ, in one phrase; None when none does."""
    for i, row in enumerate(rows, 1):
        merged, adapter = list(row["merged"]), list(row["adapter"])
        if merged != adapter:
            at = next((j for j, (m, a) in enumerate(zip(merged, adapter, strict=False)) if m != a), None)
            at = min(len(merged), len(adapter)) if at is None else at
            return (
                f"prompt {i} ({row['prompt']!r}) differs at token {at + 1}: merged {merged} vs "
                f"base + adapter {adapter}"
            )
    return None


def merge_request(
    plan: RunPlan, options: MergeOptions, adapter: str, train: Mapping[str, Any]
) -> dict[str, Any]:
    """What the node program gets (``train``: the training YAML as shipped; the environment is added)."""
    base = str(train["model_name_or_path"])
    export = {
        "model_name_or_path": base,
        "adapter_name_or_path": adapter,
        "template": train.get("template") or "default",
        "finetuning_type": "lora",
        "trust_remote_code": bool(train.get("trust_remote_code", False)),
        "export_device": "cpu" if options.device == "cpu" else "auto",
        "export_size": 5,
        "export_legacy_format": False,
        "infer_dtype": options.dtype,
    }
    return {
        "export": export,
        "dest": f"{layout().run_dir(plan.run_id)}/{MERGED_DIR}",
        "base": base,
        "adapter": adapter,
        "device": "cuda" if options.device == "gpu" else "cpu",
        "prompts": list(options.prompts),
        "max_new_tokens": options.max_new_tokens,
    }


def merge_after_run(
    run: RunDir, plan: RunPlan, runner: PlaybookRunner, *, train: Mapping[str, Any], out: IO[str]
) -> None:
    """Merge and check after a successful run when the job wants it (``train``: the training YAML as shipped);
    raises JobFailedError (one line) when the merge or its check fails: the run stays succeeded, ``merge`` in
    the record says what went wrong."""
    from launcher.transfer.manifest import manifest_digest  # noqa: PLC0415
    from launcher.transfer.staging import node_connections  # noqa: PLC0415

    spec = plan.spec
    options = spec.merge
    go, why = wanted(options, spec.stage.model is not None, train)
    if go and spec.slurm.login_only:
        go, why = False, "the nodes are not reached with slurm.shared_dir (login host only)"
    if not go:
        if why and options.enabled:
            print(f"note: merge: not done: {why}", file=out, flush=True)
        return
    t0 = time.monotonic()
    holders = adapter_holders(run.load().get("outputs") or {})
    host = options.host or next((h for h in plan.hosts if h in holders), None)
    folder = run.path / "merge"

    def fail(line: str, **fields: Any) -> JobFailedError:  # noqa: ANN401 - JSON values
        run.set_merge({"status": "failed", "host": host, "error": line, **fields})
        return JobFailedError(f"merge: {line}")

    if host is None:
        raise fail(
            "no node holds the final adapter (adapter_model.safetensors in output_dir); nothing merged"
        )
    if host not in holders:
        where = ", ".join(sorted(holders)) or "no node"
        raise fail(f"{host}: it holds no final adapter (it is on {where}); set merge.host to one of those")
    request = {**merge_request(plan, options, holders[host], train), "env": dict(plan.envs.get(host) or {})}
    print(
        f"merge: {host}: merging {holders[host]} into {request['base']} on the {options.device} ...",
        file=out,
        flush=True,
    )
    ssh = node_connections(runner, host, spec.stage.node_cache).get(host, [])
    python = nodecall.node_python(str(plan.jobs[host]["argv"][0]))
    answer = nodecall.call(
        ssh, python, "merge", request, log=folder / f"{host}.log", timeout_s=float(options.timeout_s)
    )
    answer_files: dict[str, dict[str, Any]] = answer["files"] if isinstance(answer.get("files"), dict) else {}
    result = {
        "host": host,
        "dest": request["dest"],
        "request": {k: v for k, v in request.items() if k != "env"},
    }
    folder.mkdir(exist_ok=True, mode=0o700)
    (folder / "result.json").write_text(json.dumps({**result, "answer": answer}, indent=1) + "\n")
    if not answer.get("ok"):
        raise fail(f"{host}: {answer.get('error')} (log: {folder / f'{host}.log'})")
    digest = manifest_digest(answer_files)
    size = sum(int(f["size"]) for f in answer_files.values())
    (folder / "merged.manifest.json").write_text(
        json.dumps(
            {"dest": request["dest"], "host": host, "digest": digest, "manifest": answer_files}, indent=1
        )
        + "\n"
    )
    rows = list(answer.get("prompts") or [])
    record = {
        "host": host,
        "dest": request["dest"],
        "device": options.device,
        "dtype": answer.get("dtype"),
        "digest": digest,
        "files": len(answer_files),
        "bytes": size,
        "seconds": answer.get("seconds"),
        "check_seconds": answer.get("check_seconds"),
        "peak_rss_kb": answer.get("peak_rss_kb"),
        "peak_gpu_bytes": answer.get("peak_gpu_bytes"),
        "prompts": len(rows),
        "same": bool(answer.get("same")),
    }
    print(
        f"merge: {host}: {request['dest']}: {len(answer_files)} files, {size} bytes, manifest {digest[:19]}, "
        f"{answer.get('dtype')}, in {answer.get('seconds')} s "
        f"(peak RSS {int(answer.get('peak_rss_kb') or 0) // 1024} MiB)",
        file=out,
        flush=True,
    )
    differs = first_difference(rows)
    if differs or not rows:
        raise fail(f"smoke check: {differs or 'no prompt was checked'}", **record)
    run.set_merge({"status": "checked", **record, "total_s": round(time.monotonic() - t0, 2)})
    print(
        f"merge: smoke check: {len(rows)}/{len(rows)} prompts give the same {options.max_new_tokens} greedy "
        f"tokens from the merged model and from base + adapter ({answer.get('check_seconds')} s)",
        file=out,
        flush=True,
    )
