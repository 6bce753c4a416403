"""The node agent's ``collect``: the status, the output files and ``collect.tar.gz`` (logs, state, metrics)
for the launcher to fetch. Standard library only.
"""

from __future__ import annotations

import tarfile
from pathlib import Path
from typing import Any

from . import contract
from . import gpu as mift_gpu
from .common import STATE_FILE
from .status import cmd_status
from .stop import watch_files
from .supervise import rank_logs, tensorboard_files

COLLECT_ARCHIVE = contract.COLLECT_ARCHIVE
# what the launcher fetches from a node run directory and from its output_dir (small files only)
COLLECT_RUN_FILES = (
    contract.TRAINER_LOG,
    STATE_FILE,
    contract.JOB_FILE,
    contract.RC_FILE,
    "slurm.out",
    mift_gpu.TELEMETRY_FILE,
    mift_gpu.TELEMETRY_STATE,
    mift_gpu.AFTER_FILE,
)
COLLECT_OUTPUT_FILES = ("trainer_log.jsonl", "all_results.json", "train_results.json", "adapter_config.json")


def cmd_collect(run_dir: Path, remote: bool = False) -> dict[str, Any]:
    """Pack the run's logs, state and metrics into one archive in the run dir (one fetch instead of eight).

    Returns the status (as ``status``), the output files (full paths) and the archive's path.
    """
    status = cmd_status(run_dir, remote)
    # the trainer has ended (collect follows stop or success): its GPUs must be idle and healthy; on a login
    # host (remote) the GPUs are another host's
    gpu_after = None if remote or not status.get("run_id") else mift_gpu.after_check(run_dir)
    output_dir = Path(status["output_dir"])
    outputs = sorted(str(p) for p in output_dir.rglob("*") if p.is_file()) if output_dir.is_dir() else []
    archive = run_dir / COLLECT_ARCHIVE
    tmp = archive.with_name(archive.name + ".tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        for folder, names in ((run_dir, COLLECT_RUN_FILES), (output_dir, COLLECT_OUTPUT_FILES)):
            for name in names:
                if (folder / name).is_file():
                    tar.add(folder / name, arcname=name)
        for path in watch_files(run_dir):
            tar.add(path, arcname=path.name)
        for name, path in rank_logs(run_dir).items():
            tar.add(path, arcname=name)
        for path in tensorboard_files(output_dir):
            tar.add(path, arcname=path.name)
    tmp.chmod(0o600)
    tmp.replace(archive)
    return {"ok": True, "status": status, "outputs": outputs, "archive": str(archive), "gpu_after": gpu_after}
