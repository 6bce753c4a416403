#!/usr/bin/env python3
"""Before and after training, on one node, in the node venv's interpreter: tokenize once, merge an adapter.

The launcher (``launcher.tokenize_once``, ``launcher.merge``) runs it over the ssh Ansible uses, one JSON
request on stdin, one JSON answer as the last line of stdout (everything the libraries print goes to stderr):

    python3 mift_node.pyz prepare tokenize < request
        {"env", "args": the training YAML's keys, "dest", "stage"}: LLaMA-Factory's own data pipeline
        (``get_dataset``, the one the trainer runs) with ``tokenized_path`` a hidden partial folder beside
        ``dest``, renamed to ``dest`` only when complete, its manifest kept beside it; a ``dest`` that still
        matches that manifest is not made again. Answer: {"ok", "tokenized": bool, "seconds", "files": {rel:
        {size, sha256}}}.
    python3 mift_node.pyz prepare merge < request
        {"env", "export": ``llamafactory-cli export`` arguments, "dest", "base", "adapter", "dtype", "device",
        "prompts", "max_new_tokens"}: the adapter merged into the base model (LLaMA-Factory's export) in a
        partial folder renamed to ``dest``; then the smoke check: greedy tokens of the merged model and of the
        base model with the adapter applied (peft, not merged), each prompt, same dtype and device. Answer:
        {"ok", "seconds", "check_seconds", "files", "dtype", "prompts": [{"prompt", "merged", "adapter",
        "base"}], "same": bool, "peak_rss_kb", "peak_gpu_bytes"} ("base": the base model alone, for contrast).
    python3 mift_node.pyz prepare tar DIR
        the folder as an uncompressed tar stream on stdout (the controller checks each file's sha256 after).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import resource
import shutil
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import IO, Any

CHUNK = 1 << 20


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def manifest(root: Path) -> dict[str, dict[str, Any]]:
    """Size and sha256 of every file under ``root`` (relative paths, sorted)."""
    files = sorted(p for p in root.rglob("*") if p.is_file())
    return {str(p.relative_to(root)): {"size": p.stat().st_size, "sha256": sha256_of(p)} for p in files}


def _partial(dest: Path) -> Path:
    dest.parent.mkdir(parents=True, exist_ok=True)
    return dest.parent / f".{dest.name}.mift-part.{os.getpid()}"


def _publish(part: Path, dest: Path) -> None:
    """Rename the complete partial folder to ``dest`` (a folder already there is replaced)."""
    if dest.exists():
        old = dest.parent / f".{dest.name}.mift-old.{os.getpid()}"
        dest.rename(old)
        shutil.rmtree(old, ignore_errors=True)
    part.rename(dest)


def manifest_file(dest: Path) -> Path:
    """The manifest of a published folder, kept beside it (LLaMA-Factory reads every file inside)."""
    return dest.parent / f".{dest.name}.manifest.json"


def llamafactory_tokenize(args: dict[str, Any], stage: str) -> None:
    """LLaMA-Factory's data pipeline (the trainer's ``get_dataset``), saving to ``args["tokenized_path"]``."""
    from llamafactory.data import get_dataset, get_template_and_fix_tokenizer  # noqa: PLC0415
    from llamafactory.hparams import get_train_args  # noqa: PLC0415
    from llamafactory.model import load_tokenizer  # noqa: PLC0415

    model_args, data_args, training_args, _finetuning, _generating = get_train_args(args)
    module = load_tokenizer(model_args)
    template = get_template_and_fix_tokenizer(module["tokenizer"], data_args)
    get_dataset(template, model_args, data_args, training_args, stage=stage, **module)


def tokenize(request: dict[str, Any], pipeline: Any = llamafactory_tokenize) -> dict[str, Any]:  # noqa: ANN401
    """Tokenize into ``dest`` unless it holds, unchanged, what an earlier pass published there."""
    dest = Path(request["dest"])
    t0 = time.monotonic()
    if dest.is_dir():
        with contextlib.suppress(OSError, ValueError):
            files = manifest(dest)
            if json.loads(manifest_file(dest).read_text()) == files:
                return {"ok": True, "tokenized": False, "seconds": 0.0, "files": files}
        shutil.rmtree(dest)  # not what was published (a file removed or changed): made again
    part = _partial(dest)
    scratch = tempfile.mkdtemp(prefix="mift-tokenize-")
    try:
        args = {**request["args"], "tokenized_path": str(part), "output_dir": scratch, "report_to": "none"}
        for key in ("deepspeed", "resume_from_checkpoint"):
            args.pop(key, None)
        pipeline(args, request["stage"])
        if not (part.is_dir() and any(part.iterdir())):
            return {"ok": False, "error": f"LLaMA-Factory wrote nothing to {part}"}
        files = manifest(part)
        manifest_file(dest).write_text(json.dumps(files))
        _publish(part, dest)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(part, ignore_errors=True)
    return {"ok": True, "tokenized": True, "seconds": round(time.monotonic() - t0, 2), "files": files}


def _greedy(model: Any, tokenizer: Any, prompts: list[str], new: int, device: str) -> list[list[int]]:  # noqa: ANN401
    import torch  # noqa: PLC0415

    out = []
    with torch.no_grad():
        for prompt in prompts:
            ids = tokenizer(prompt, return_tensors="pt").to(device)
            gen = model.generate(
                **ids,
                max_new_tokens=new,
                min_new_tokens=new,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id
                if tokenizer.pad_token_id is not None
                else tokenizer.eos_token_id,
            )
            out.append([int(t) for t in gen[0][ids["input_ids"].shape[1] :]])
    return out


def merge(request: dict[str, Any]) -> dict[str, Any]:
    import gc  # noqa: PLC0415

    import torch  # noqa: PLC0415
    from llamafactory.train.tuner import export_model  # noqa: PLC0415
    from peft import PeftModel  # noqa: PLC0415
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: PLC0415

    dest = Path(request["dest"])
    part = _partial(dest)
    t0 = time.monotonic()
    try:
        export_model({**request["export"], "export_dir": str(part)})
        files = manifest(part)
        _publish(part, dest)
    finally:
        shutil.rmtree(part, ignore_errors=True)
    seconds = time.monotonic() - t0
    t1 = time.monotonic()
    device = "cuda" if request["device"] == "cuda" else "cpu"
    config = json.loads((dest / "config.json").read_text())
    saved = config.get("torch_dtype") or config.get("dtype") or "float32"
    dtype = getattr(torch, str(saved))
    tokenizer = AutoTokenizer.from_pretrained(str(dest))
    prompts, new = list(request["prompts"]), int(request["max_new_tokens"])
    model: Any = AutoModelForCausalLM.from_pretrained(str(dest), dtype=dtype)
    model = model.to(device).eval()
    merged = _greedy(model, tokenizer, prompts, new, device)
    del model
    gc.collect()
    base: Any = AutoModelForCausalLM.from_pretrained(request["base"], dtype=dtype)
    model = PeftModel.from_pretrained(base.to(device), request["adapter"]).to(device).eval()
    adapter = _greedy(model, tokenizer, prompts, new, device)
    with model.disable_adapter():  # the base alone: says whether the adapter changes these tokens at all
        alone = _greedy(model, tokenizer, prompts, new, device)
    rows = [
        {"prompt": p, "merged": m, "adapter": a, "base": b}
        for p, m, a, b in zip(prompts, merged, adapter, alone, strict=True)
    ]
    return {
        "ok": True,
        "seconds": round(seconds, 2),
        "check_seconds": round(time.monotonic() - t1, 2),
        "files": files,
        "dtype": str(saved),
        "device": device,
        "prompts": rows,
        "same": merged == adapter,
        "peak_rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        "peak_gpu_bytes": int(torch.cuda.max_memory_allocated()) if device == "cuda" else 0,
    }


def send_tar(folder: Path, sink: IO[bytes]) -> None:
    with tarfile.open(fileobj=sink, mode="w|") as tar:
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            tar.add(str(path), arcname=str(path.relative_to(folder)), recursive=False)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["tar"] and len(args) == 2:
        send_tar(Path(args[1]), sys.stdout.buffer)
        sys.stdout.flush()
        return 0
    if args not in (["tokenize"], ["merge"]):
        print("usage: mift_prepare.py tokenize|merge < request.json | tar DIR", file=sys.stderr)
        return 2
    request = json.loads(sys.stdin.read())
    os.environ.update({str(k): str(v) for k, v in (request.get("env") or {}).items()})
    answer_fd = os.dup(1)
    os.dup2(2, 1)  # what the libraries print goes to stderr; stdout carries the one answer
    answer = os.fdopen(answer_fd, "w")
    try:
        result = tokenize(request) if args == ["tokenize"] else merge(request)
    except Exception as err:  # the answer names the failure in one line; the traceback stays in the log
        import traceback  # noqa: PLC0415

        traceback.print_exc()
        result = {"ok": False, "error": f"{type(err).__name__}: {err}".splitlines()[0]}
    with contextlib.suppress(OSError):
        sys.stdout.flush()
    answer.write(json.dumps(result) + "\n")
    answer.flush()
    return 0 if result.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
