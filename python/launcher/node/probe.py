#!/usr/bin/env python3
"""Read-only probe of a node, run by the launcher's preflight before anything is written on the node.

Standard library only: preflight runs it with the system ``python3`` (``mift_node.pyz probe``; nothing but the
node program is written, no directory created). One command prints one JSON object (read by
``launcher.preflight``): free disk where the outputs go, whether the master port is free, the trainer entry
point, the stack versions installed in the node venv now, the local facts provisioning wrote
(``/etc/ansible/facts.d/mift_{stack,gpus,flash_attn}.fact``, JSON; read here, so that preflight needs no
fact-gathering round trip), the ``checkpoint-N`` folders of a run to resume, the node paths the job needs
(``--require``: the model folder, a named resume checkpoint, the dataset folder; answered as ``missing``),
what the trainer's torch reports (CUDA or ROCm build, GPU count and memory: ``VENV/bin/python3``, else the
shebang of ``VENV/bin/llamafactory-cli``, which is what a ``pip install --target`` folder has), and the node's
fabric facts (``net``: the interfaces and their addresses from ``ip -j addr``, the RDMA ports from
``/sys/class/infiniband``, the boot id; read by ``launcher.fabric``). With ``--gpu-tools`` (``launcher
check``) it also hands back what ``amd-smi`` prints (firmware, ECC and PCIe). The versions and torch are asked
in parallel. Never fails: the controller decides what the answers mean.

    python3 mift_node.pyz probe RUN_DIR --venv VENV --facts-dir DIR --dists D1,D2,.. [--path OUTPUT_DIR]
        [--port PORT] [--checkpoints DIR] [--require JSON] [--gpu-tools]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from .probe_net import gpu_tools, net_facts
from .probe_paths import checkpoints, missing_paths

TORCH_SNIPPET = """
import json, torch
n = torch.cuda.device_count() if torch.cuda.is_available() else 0
props = [torch.cuda.get_device_properties(i) for i in range(n)]
print(json.dumps({
    "torch": torch.__version__,
    "cuda": torch.version.cuda,
    "hip": getattr(torch.version, "hip", None),
    "device_count": n,
    "devices": [
        {"name": p.name, "total_memory": int(p.total_memory), "arch": getattr(p, "gcnArchName", None)}
        for p in props
    ],
}))
"""


def shebang_python(script: Path) -> str | None:
    """Return the interpreter named by a script's ``#!`` line (``/usr/bin/env NAME`` resolved on PATH)."""
    try:
        first = script.read_bytes()[:1024].split(b"\n", 1)[0].decode()
    except (OSError, UnicodeDecodeError):
        return None
    words = first[2:].split() if first.startswith("#!") else []
    if not words:
        return None
    if Path(words[0]).name == "env" and len(words) > 1:
        return shutil.which(words[-1])
    return words[0]


def venv_python(venv: Path) -> str | None:
    """Return the trainer's interpreter: ``bin/python3`` or ``bin/python``, else the CLI's shebang."""
    for name in ("python3", "python"):
        candidate = venv / "bin" / name
        if os.access(candidate, os.X_OK):
            return str(candidate)
    return shebang_python(venv / "bin" / "llamafactory-cli")


def probe(venv: Path, timeout: float = 120.0) -> dict[str, Any]:
    """Return what torch reports in the trainer's interpreter, or ``{"error": ...}``."""
    python = venv_python(venv)
    if python is None:
        return {"error": f"no python3 in {venv}/bin and no llamafactory-cli shebang"}
    try:
        proc = subprocess.run(
            [python, "-c", TORCH_SNIPPET], capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        return {"python": python, "error": str(err)[:300]}
    lines = proc.stdout.strip().splitlines()
    if proc.returncode or not lines:
        err_lines = proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"]
        return {"python": python, "error": err_lines[-1][:300]}
    try:
        data = json.loads(lines[-1])
    except ValueError:
        return {"python": python, "error": f"unreadable output: {lines[-1][:200]}"}
    if not isinstance(data, dict):
        return {"python": python, "error": "output is not a JSON object"}
    return {**data, "python": python}


VISIBLE_DEVICES = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")


def _stamp(path: Path) -> list[Any]:
    try:
        st = path.stat()
    except OSError:
        return [str(path), None, None]
    return [str(path), st.st_mtime_ns, st.st_size]


def torch_key(venv: Path) -> str | None:
    """Return a key of what torch's answer depends on, read without starting an interpreter; None: always ask.

    The boot (``boot_id``), the GPU device nodes (``/dev/kfd``, ``/dev/dri/renderD*``, ``/dev/nvidia<N>``),
    the visible-devices variables, the trainer's interpreter, and torch's installation as files tell it: its
    ``RECORD`` (rewritten by every pip install), the package folder, ``__init__.py`` and ``version.py``. None
    when torch's metadata is not found in the venv or on ``PYTHONPATH``.
    """
    dirs = [*venv.glob("lib/python3*/site-packages")]
    dirs += [Path(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    records = sorted(r for d in dirs for r in d.glob("torch-*.dist-info/RECORD"))
    if not records:
        return None
    packages = [r.parents[1] / "torch" for r in records]
    files = [*records, *packages, *(pkg / name for pkg in packages for name in ("__init__.py", "version.py"))]
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = ""
    dev = Path("/dev")
    devices = sorted(str(p) for pattern in ("kfd", "dri/renderD*", "nvidia[0-9]*") for p in dev.glob(pattern))
    parts: list[Any] = [boot, devices, {k: os.environ.get(k) for k in VISIBLE_DEVICES}, venv_python(venv)]
    parts.append([_stamp(f) for f in files])
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


def free_bytes(path: Path) -> int:
    """Return the bytes free on the file system that holds ``path`` (or its nearest existing parent)."""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).free


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # as torchrun's TCPStore does: connections of a finished run in TIME_WAIT do not block the port,
        # only a live listener does
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("0.0.0.0", port))  # noqa: S104 - the master listens on every address
        except OSError:
            return False
    return True


# the stack's distributions (the node layout's mift_defaults_stack_packages, which stack_check's probe
# records) come as ``--dists`` from the launcher: read fresh by preflight, compared with the provisioned fact
# optional kernel packages a plan may switch on (``plan_liger``: LLaMA-Factory's ``enable_liger_kernel``);
# provisioning does not install them, preflight checks them where the shipped plan needs them
OPTIONAL_DISTS = ("liger_kernel",)
_VERSIONS_SCRIPT = """
import importlib.metadata as md, json, sys
def v(d):
    for name in (d.replace('_', '-'), d):
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            pass
    return None
print(json.dumps({d: v(d) for d in sys.argv[1:]}))
"""


def installed_versions(venv: Path, dists: tuple[str, ...]) -> dict[str, Any] | None:
    """Return the versions of ``dists`` installed in ``venv`` now (None: no venv python)."""
    python = venv / "bin" / "python"
    if not os.access(python, os.X_OK):
        return None
    try:
        out = subprocess.run(
            [str(python), "-I", "-c", _VERSIONS_SCRIPT, *dists],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env={"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"},
        )
        data = json.loads(out.stdout)
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None
    return data if isinstance(data, dict) else None


# Load the job's tokenizer as the trainer will (offline), in the venv's interpreter: a tokenizer that needs a
# package the venv lacks (sentencepiece, tiktoken, protobuf) fails here, before the start. Controller side:
# launcher/preflight/tokenizer_check.py.
_TOKENIZER_SCRIPT = """
import json, sys
try:
    from transformers import AutoTokenizer
    trust = sys.argv[2] == "1"
    tok = AutoTokenizer.from_pretrained(sys.argv[1], local_files_only=True, trust_remote_code=trust)
    print(json.dumps({"ok": True, "class": type(tok).__name__}))
except Exception as err:
    print(json.dumps({"ok": False, "error": f"{type(err).__name__}: {err}"[:600]}))
"""
# files of tokenizers that need more than the `tokenizers` library: sentencepiece models, tiktoken files
_SLOW_TOKENIZER_FILES = (
    "tokenizer.model",
    "*.tiktoken",
    "tiktoken.model",
    "spiece.model",
    "sentencepiece*.model",
)


def tokenizer_check(venv: Path, model: Path, trust_remote_code: bool) -> dict[str, Any] | None:
    """Load the tokenizer in ``model`` with the venv's transformers (None: no such folder, reported as missing
    elsewhere). Only a tokenizer that needs more than the `tokenizers` library (a sentencepiece or tiktoken
    file) or remote code is loaded: that is where a missing package shows; a folder with ``tokenizer.json``
    alone, or no tokenizer file, is not (importing transformers costs seconds of CPU on every preflight)."""
    if not model.is_dir():
        return None
    slow = [p.name for pat in _SLOW_TOKENIZER_FILES for p in model.glob(pat)]
    if not slow and not trust_remote_code:
        return {"ok": True, "loaded": False, "model": str(model)}
    python = venv / "bin" / "python"
    env = {
        "PATH": "/usr/bin:/bin",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
    }
    try:
        out = subprocess.run(
            [str(python), "-I", "-c", _TOKENIZER_SCRIPT, str(model), "1" if trust_remote_code else "0"],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
            env=env,
        )
        lines = out.stdout.strip().splitlines()
        data = (
            json.loads(lines[-1])
            if lines
            else {"ok": False, "error": (out.stderr.strip() or "no answer")[-600:]}
        )
    except (OSError, ValueError, subprocess.TimeoutExpired) as err:
        data = {"ok": False, "error": f"{type(err).__name__}: {err}"[:600]}
    return {**data, "loaded": True, "model": str(model), "files": sorted(slow)}


LOCAL_FACTS = ("mift_stack", "mift_gpus", "mift_flash_attn")


def local_facts(facts_dir: Path) -> dict[str, dict[str, Any]]:
    """Return the local facts preflight reads (each ``{}`` when absent or not a JSON object)."""
    out: dict[str, dict[str, Any]] = {}
    for name in LOCAL_FACTS:
        try:
            value = json.loads((facts_dir / f"{name}.fact").read_text())
        except (OSError, ValueError):
            value = {}
        out[name] = value if isinstance(value, dict) else {}
    return out


def cmd_facts(
    path: Path,
    port: int | None,
    venv: Path,
    ckpt_dir: Path | None = None,
    torch_known: str | None = None,
    *,
    facts_dir: Path,
    stack_dists: tuple[str, ...],
    required: tuple[Path, object] | None = None,
    with_gpu_tools: bool = False,
    tokenizer: tuple[Path, bool] | None = None,
) -> dict[str, Any]:
    """Report what preflight checks: free disk at ``path``, ``port`` free, the trainer entry point, versions,
    what torch reports.

    ``torch_known``: the :func:`torch_key` of the torch answer the controller already holds for this node;
    when the key is unchanged, torch is not asked again (``{"cached": true, "key": ...}``). ``required``: the
    run directory and the node paths the job needs (:func:`missing_paths`; None: not asked). Read-only:
    nothing is written on the node.
    """
    cli = venv / "bin" / "llamafactory-cli"
    key = torch_key(venv)
    ask_torch = key is None or key != torch_known
    with concurrent.futures.ThreadPoolExecutor(2) as pool:  # two interpreters start at once
        versions = pool.submit(installed_versions, venv, (*stack_dists, *OPTIONAL_DISTS))
        torch = pool.submit(probe, venv) if ask_torch else None
        torch_answer = torch.result() if torch is not None else {"cached": True}
        return {
            "ok": True,
            "hostname": socket.gethostname(),
            "free_bytes": free_bytes(path),
            "port": port,
            "port_free": _port_free(port) if port else None,
            "trainer_cli": str(cli),
            "trainer_cli_found": os.access(cli, os.X_OK),
            "python": sys.version.split()[0],
            "cpus": os.cpu_count(),
            "mem_total_bytes": _mem_total(),
            "versions": _only(versions.result(), stack_dists),
            "optional": _only(versions.result(), OPTIONAL_DISTS),
            "checkpoints": checkpoints(ckpt_dir) if ckpt_dir is not None else None,
            "missing": missing_paths(*required) if required is not None else None,
            "local_facts": local_facts(facts_dir),
            "torch": {**torch_answer, **({"key": key} if key else {})},
            "net": net_facts(),
            **({"gpu_tools": gpu_tools()} if with_gpu_tools else {}),
            **({"tokenizer": tokenizer_check(venv, *tokenizer)} if tokenizer is not None else {}),
        }


def _only(versions: dict[str, Any] | None, dists: tuple[str, ...]) -> dict[str, Any] | None:
    return None if versions is None else {d: versions.get(d) for d in dists}


def _mem_total() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def main(argv: list[str] | None = None) -> int:
    """Print the probe's JSON object."""
    parser = argparse.ArgumentParser(prog="mift_probe.py", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, help="the node run directory (need not exist)")
    parser.add_argument("--port", type=int, default=0, help="TCP port that must be free")
    parser.add_argument("--path", type=Path, default=Path("/"), help="where outputs will be written")
    # the node layout's venv and facts folder come from the launcher (launcher/nodelayout.py): no copy here
    parser.add_argument("--venv", type=Path, required=True, help="the node venv")
    parser.add_argument("--facts-dir", type=Path, required=True, help="provisioning's local facts")
    parser.add_argument("--dists", required=True, help="the stack's distributions, comma-separated")
    parser.add_argument("--checkpoints", type=Path, default=None, help="list the checkpoint-N folders here")
    parser.add_argument("--torch-known", default=None, help="torch_key of the answer the controller holds")
    parser.add_argument("--require", default=None, help="JSON list of the node paths the job needs")
    parser.add_argument("--gpu-tools", action="store_true", help="also hand back what amd-smi prints")
    parser.add_argument(
        "--tokenizer", type=Path, default=None, help="load the tokenizer in this model folder"
    )
    parser.add_argument("--trust-remote-code", action="store_true", help="the tokenizer's own code may run")
    args = parser.parse_args(argv)
    try:
        requirements: object = json.loads(args.require) if args.require else None
    except ValueError:
        requirements = "not JSON"  # answered as missing: never a traceback
    # relative paths are inside the node run directory (which may not exist yet)
    # lexically, as the trainer will see it: the run directory does not exist yet (``../RUN/output``)
    ckpt = Path(os.path.normpath(args.run_dir / args.checkpoints)) if args.checkpoints is not None else None
    required = (args.run_dir, requirements) if requirements is not None else None
    facts = cmd_facts(
        args.run_dir / args.path,
        args.port or None,
        args.venv,
        ckpt,
        args.torch_known,
        facts_dir=args.facts_dir,
        stack_dists=tuple(d for d in args.dists.split(",") if d),
        required=required,
        with_gpu_tools=args.gpu_tools,
        # relative: in the node run directory, as the trainer opens it
        tokenizer=(Path(os.path.normpath(args.run_dir / args.tokenizer)), args.trust_remote_code)
        if args.tokenizer is not None
        else None,
    )
    print(json.dumps(facts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
