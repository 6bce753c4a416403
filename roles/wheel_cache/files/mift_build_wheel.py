"""Build one wheel on the builder host for the wheel_cache role (shipped and run by Ansible).

Runs the optional pre-build commands, then the build command, in the source directory; writes the build's
output to ``<workdir>/build.log``, the result to ``<workdir>/result.json`` (the task's ``creates:`` guard),
and appends the same result as one JSON line to the host's build log. The environment (build flags) comes
from the calling task; the directory of the python running this script (the venv's ``bin``) is put first on
PATH, so that tools installed in the venv (ninja: torch's extension builder compiles serially, ignoring
MAX_JOBS, when ``ninja`` is not on PATH) are the ones the build finds. ``--require-tool`` names tools that
must be found there before anything is built. Exit status: 0 on success, the failing command's status
otherwise (2 when a required tool is missing).
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

# Environment variables recorded in the build log and result (the build flags).
_FLAG_PREFIXES = ("DS_", "MAX_JOBS", "PYTORCH_", "GPU_", "FLASH_ATTENTION_", "CFLAGS", "ROCM_")


def _run(argv: list[str], cwd: Path, log: Path, env: dict[str, str]) -> int:
    with log.open("a", encoding="utf-8") as out:
        out.write(f"+ {json.dumps(argv)} (cwd {cwd})\n")
        out.flush()
        return subprocess.run(
            argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, check=False
        ).returncode


def build_env(environ: dict[str, str], venv_bin: Path) -> dict[str, str]:
    """Return the build's environment: ``environ`` with ``venv_bin`` first on PATH (once)."""
    rest = [
        part for part in environ.get("PATH", os.defpath).split(os.pathsep) if part and part != str(venv_bin)
    ]
    return {**environ, "PATH": os.pathsep.join([str(venv_bin), *rest])}


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def main() -> int:
    """Parse arguments, build, record the result; return the exit status."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--name", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--workdir", required=True, type=Path)
    parser.add_argument("--srcdir", required=True, type=Path)
    parser.add_argument("--pre-json", default="[]", help="JSON list of argv lists run in srcdir first")
    parser.add_argument("--build-json", required=True, help="JSON argv of the build; {out} = wheel dir")
    parser.add_argument("--host-log", required=True, type=Path)
    parser.add_argument(
        "--require-tool",
        action="append",
        default=[],
        help="a tool that must be on the build PATH (repeatable)",
    )
    args = parser.parse_args()

    workdir: Path = args.workdir
    out_dir = workdir / "dist"
    out_dir.mkdir(parents=True, exist_ok=True)
    log = workdir / "build.log"
    log.write_text(f"wheel_cache build of {args.name} key {args.key}\n", encoding="utf-8")
    flags = {k: v for k, v in sorted(os.environ.items()) if k.startswith(_FLAG_PREFIXES)}
    # sys.executable is the venv's bin/python (not resolved): its directory holds the venv's tools.
    env = build_env(dict(os.environ), Path(sys.executable).parent)
    tools = {name: shutil.which(name, path=env["PATH"]) for name in sorted({"ninja", *args.require_tool})}
    with log.open("a", encoding="utf-8") as out:
        out.write(f"build flags: {json.dumps(flags)}\n")
        out.write(f"build PATH: {env['PATH']}\n")
        out.write(f"build tools: {json.dumps(tools)}\n")
    missing = [name for name in args.require_tool if not tools.get(name)]
    if missing:
        why = " (without ninja, torch's extension builder compiles serially and ignores MAX_JOBS)"
        sys.stderr.write(
            f"{args.name}: {', '.join(missing)} not found on the build PATH ({env['PATH']}): install it into "
            f"the venv before the build{why if 'ninja' in missing else ''}; see {log}\n"
        )
        return 2

    started = time.monotonic()
    commands: list[list[str]] = [*json.loads(args.pre_json)]
    build = [part.replace("{out}", str(out_dir)) for part in json.loads(args.build_json)]
    for argv in [*commands, build]:
        status = _run(argv, args.srcdir, log, env)
        if status != 0:
            sys.stderr.write(f"build step failed with status {status}: {argv}; see {log}\n")
            sys.stderr.write(log.read_text(encoding="utf-8")[-4000:])
            return status

    wheels = sorted(out_dir.glob("*.whl"))
    if len(wheels) != 1:
        sys.stderr.write(f"expected exactly one wheel in {out_dir}, found {[w.name for w in wheels]}\n")
        return 1
    wheel = wheels[0]
    parts = wheel.name.split("-")
    result = {
        "name": args.name,
        "key": args.key,
        "wheel": wheel.name,
        "dist": parts[0],
        "version": parts[1],
        "sha256": _sha256(wheel),
        "size": wheel.stat().st_size,
        "built_by": socket.gethostname(),
        "built_at": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "build_seconds": round(time.monotonic() - started, 1),
        "build_flags": flags,
        "build_tools": tools,
    }
    (workdir / "result.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    args.host_log.parent.mkdir(parents=True, exist_ok=True)
    with args.host_log.open("a", encoding="utf-8") as host_log:
        host_log.write(json.dumps(result, sort_keys=True) + "\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
