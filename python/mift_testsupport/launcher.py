"""``python -m launcher`` as a subprocess of a test or bench, with its own runs folder."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from mift_testsupport.paths import REPO_ROOT


def launcher_argv(*args: str) -> list[str]:
    """The command line of ``python -m launcher ARGS`` with this interpreter."""
    return [sys.executable, "-m", "launcher", *args]


@dataclass
class Launcher:
    """Runs the launcher from the repository root with ``MIFT_RUNS_DIR=runs``; started ones write to ``logs``.

    ``real_backend`` (default): validate with DeepSpeed's and LLaMA-Factory's own classes, as a user's run
    does.
    Off: the shipped key lists (``MIFT_VALIDATE_BUILTIN=1``): the same checks without importing torch.
    """

    runs: Path
    logs: Path
    real_backend: bool = True

    def __post_init__(self) -> None:
        self.runs.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)

    def env(self, *, real_backend: bool | None = None) -> dict[str, str]:
        env = {**os.environ, "MIFT_RUNS_DIR": str(self.runs), "PYTHONUNBUFFERED": "1", "LAUNCHER_DEBUG": ""}
        if self.real_backend if real_backend is None else real_backend:
            env.pop("MIFT_VALIDATE_BUILTIN", None)
        else:
            env["MIFT_VALIDATE_BUILTIN"] = "1"
        return env

    def run(
        self, *args: str, timeout: float = 900, real_backend: bool | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run the launcher to its end; never raises on its exit code."""
        return subprocess.run(
            launcher_argv(*args),
            env=self.env(real_backend=real_backend),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
        )

    def start(self, *args: str, real_backend: bool | None = None) -> tuple[subprocess.Popen[str], Path]:
        """Start the launcher in the background; return it and the file that gets its output."""
        log_path = self.logs / f"launcher-{time.monotonic_ns()}.log"
        with log_path.open("w") as log:
            proc = subprocess.Popen(
                launcher_argv(*args),
                env=self.env(real_backend=real_backend),
                stdout=log,
                stderr=subprocess.STDOUT,
                text=True,
                cwd=REPO_ROOT,
                stdin=subprocess.DEVNULL,
            )
        return proc, log_path


def finish(proc: subprocess.Popen[str], log: Path, timeout: float = 300) -> str:
    """Wait for a started launcher (killed after ``timeout`` s) and return its output."""
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    return log.read_text()
