"""GPU telemetry of one node (the node agent's sampler): parse the GPU tools, sample them while the trainer
runs, fail the run on a GPU that breaks, check the GPUs after the run.

Standard library only: part of the node program (``mift_node.pyz``), which the launch playbook puts into the
node run directory (the parsers: ``gpu_parse``). Files it writes in
the node run directory (collected into ``nodes/<host>/`` of the controller run directory):

* ``telemetry.jsonl`` -- one JSON line per sample: ``{"t", "kind": "baseline"|"sample", "tool", "gpus"}``
* ``telemetry.json``  -- the sampler's state: the latest sample's summary, its warning, the fault it found
* ``gpu_after.json``  -- the check after the run (``collect``): processes on the GPUs, new ECC errors

Tools, the first found: ``amd-smi metric --json`` (PATH, then ``/opt/rocm/bin``), else
``nvidia-smi --query-gpu=... --format=csv,noheader,nounits``. Every call runs in its own session with a
timeout; on a timeout the whole process group is killed and sampling stops for the run (a hung tool often
holds a driver lock: calling it again would pile up hung processes). A tool that fails is reported once and
sampled again; a tool that is absent (or exits 127, "command not found") leaves telemetry off without a
warning.

A GPU fault fails the run: an uncorrectable ECC count above the baseline's, or a GPU of the baseline that no
longer answers.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from .common import read_json, write_json
from .gpu_parse import GPU_DEVICE_RE, NVIDIA_FIELDS, parse_amd_metric, parse_nvidia_query

TELEMETRY_FILE = "telemetry.jsonl"
TELEMETRY_STATE = "telemetry.json"
AFTER_FILE = "gpu_after.json"
TOOL_TIMEOUT_S = 10.0  # one tool call; amd-smi metric answers in about a second on an idle node
ROCM_BIN = "/opt/rocm/bin"
MISSING_RC = 127  # the shell's "command not found" (and the test double's "no capture")
AMD_ARGV = ("metric", "--json")
NVIDIA_ARGV = (f"--query-gpu={','.join(NVIDIA_FIELDS)}", "--format=csv,noheader,nounits")


class ToolError(Exception):
    """A tool call that did not give a sample (``timed_out``: it did not answer in time)."""

    def __init__(self, message: str, *, timed_out: bool = False, missing: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out
        self.missing = missing


class Tool:
    """One GPU tool: how to call it, how to parse its answer. Calls never outlive their timeout."""

    def __init__(
        self, name: str, path: str, args: tuple[str, ...], timeout_s: float = TOOL_TIMEOUT_S
    ) -> None:
        self.name = name
        self.argv = [path, *args]
        self.timeout_s = timeout_s
        self.proc: subprocess.Popen[bytes] | None = None

    @classmethod
    def find(cls, timeout_s: float = TOOL_TIMEOUT_S) -> Tool | None:
        """Return amd-smi (PATH, then /opt/rocm/bin), else nvidia-smi (PATH), else None."""
        path = os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")
        amd = shutil.which("amd-smi", path=f"{path}{os.pathsep}{ROCM_BIN}")
        if amd:
            return cls("amd-smi", amd, AMD_ARGV, timeout_s)
        nvidia = shutil.which("nvidia-smi", path=path)
        if nvidia:
            return cls("nvidia-smi", nvidia, NVIDIA_ARGV, timeout_s)
        return None

    @property
    def command(self) -> str:
        """Return the call as a user would type it."""
        return " ".join([self.name, *self.argv[1:]])

    def call(self) -> list[dict[str, Any]]:
        """Run the tool once; return its GPUs or raise :class:`ToolError` (one line)."""
        try:
            proc = subprocess.Popen(  # argv from Tool.find, no shell
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # a timeout kills the tool's whole group, its children too
            )
        except OSError as err:
            raise ToolError(f"{self.command}: {err.strerror or err}", missing=True) from None
        self.proc = proc
        try:
            out, err_bytes = proc.communicate(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise ToolError(f"{self.command}: no answer in {self.timeout_s:g} s", timed_out=True) from None
        finally:
            self.proc = None
        if proc.returncode == MISSING_RC:
            raise ToolError(f"{self.command}: exit status {MISSING_RC} (not available)", missing=True)
        if proc.returncode != 0:
            last = (err_bytes.decode("utf-8", "replace").strip().splitlines() or [""])[-1]
            raise ToolError(f"{self.command}: exit status {proc.returncode}" + (f": {last}" if last else ""))
        text = out.decode("utf-8", "replace")
        try:
            return parse_amd_metric(text) if self.name == "amd-smi" else parse_nvidia_query(text)
        except ValueError as err:
            raise ToolError(f"{self.command}: unreadable output: {err}") from None

    def kill(self) -> None:
        """Kill the call in flight (its process group), if any."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)


# --- decisions ----------------------------------------------------------------------------------------


def gpu_faults(baseline: list[dict[str, Any]], current: list[dict[str, Any]]) -> list[str]:
    """Return what broke between the baseline and a sample: a new uncorrectable ECC error, a GPU gone."""
    now = {g["gpu"]: g for g in current}
    faults = []
    for gpu in baseline:
        index = gpu["gpu"]
        if index not in now:
            faults.append(f"GPU {index} disappeared ({len(current)} of {len(baseline)} GPUs answer)")
            continue
        before, after = gpu.get("ecc_uncorrectable"), now[index].get("ecc_uncorrectable")
        if isinstance(before, int | float) and isinstance(after, int | float) and after > before:
            faults.append(f"GPU {index}: uncorrectable ECC errors rose from {before:g} to {after:g}")
    return faults


def summary(gpus: list[dict[str, Any]]) -> dict[str, Any]:
    """Return a node's view of a sample: mean utilization, total power, hottest GPU and HBM, memory."""

    def values(key: str) -> list[float]:
        return [float(g[key]) for g in gpus if isinstance(g.get(key), int | float)]

    util, power, temp, temp_mem = (
        values("util_pct"),
        values("power_w"),
        values("temp_c"),
        values("temp_mem_c"),
    )
    used, total = values("vram_used_mib"), values("vram_total_mib")
    return {
        "gpus": len(gpus),
        "util_pct": round(sum(util) / len(util), 1) if util else None,
        "power_w": round(sum(power), 1) if power else None,
        "temp_c": max(temp) if temp else None,
        "temp_mem_c": max(temp_mem) if temp_mem else None,
        "vram_used_mib": round(sum(used), 1) if used else None,
        "vram_total_mib": round(sum(total), 1) if total else None,
        "ecc_uncorrectable": sum(values("ecc_uncorrectable")) if values("ecc_uncorrectable") else None,
    }


def gpu_processes(proc_root: Path = Path("/proc")) -> list[str]:
    """Return ``pid (name): device`` for every process holding a GPU device file open."""
    found = []
    for entry in proc_root.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fds = list((entry / "fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                target = str(fd.readlink())
            except OSError:
                continue
            if GPU_DEVICE_RE.match(target):
                try:
                    name = (entry / "comm").read_text().strip()
                except OSError:
                    name = "?"
                found.append(f"{entry.name} ({name}): {target}")
                break
    return found


# --- the sampler --------------------------------------------------------------------------------------


def _now() -> float:
    return round(time.time(), 3)


class Sampler:
    """Samples the node's GPUs every ``period_s`` in a thread of the supervisor, from a baseline taken before
    the trainer starts. :attr:`fault` is set (one line naming the GPU) when a GPU breaks; the supervisor stops
    the trainer then. Never blocks the caller for longer than one tool timeout (the baseline)."""

    def __init__(self, run_dir: Path, period_s: float, tool: Tool | None) -> None:
        self.run_dir = run_dir
        self.period_s = period_s
        self.tool = tool
        self.baseline: list[dict[str, Any]] | None = None
        self.fault = ""
        self.state: dict[str, Any] = {"period_s": period_s, "tool": tool.command if tool else None}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def for_job(cls, run_dir: Path, job: dict[str, Any]) -> Sampler | None:
        """Return the job's sampler (None when ``telemetry_period_s`` is 0 or absent)."""
        period = float(job.get("telemetry_period_s") or 0)
        if period <= 0:
            return None
        timeout = min(TOOL_TIMEOUT_S, max(2.0, period))
        return cls(run_dir, period, Tool.find(timeout))

    def _record(self, kind: str, gpus: list[dict[str, Any]]) -> None:
        line = {"t": _now(), "kind": kind, "tool": self.tool.name if self.tool else None, "gpus": gpus}
        with (self.run_dir / TELEMETRY_FILE).open("a") as fh:
            fh.write(json.dumps(line) + "\n")
        self.state.update(latest={"t": line["t"], **summary(gpus)}, samples=self.state.get("samples", 0) + 1)

    def _save(self) -> None:
        write_json(self.run_dir / TELEMETRY_STATE, {**self.state, "fault": self.fault or None})

    def _failed(self, err: ToolError) -> None:
        if self._stop.is_set():  # stop() killed the call in flight: the run ended, the tool did not fail
            return
        if err.missing:
            self.state["unavailable"] = str(err)
            self.tool = None
        elif err.timed_out:
            self.state["warning"] = f"{err}; GPU sampling off for this run"
            self.tool = None
        elif not self.state.get("warning"):
            self.state["warning"] = f"{err} (sampling goes on)"
        self._save()

    def take_baseline(self) -> None:
        """Sample once before the trainer starts (what later samples are compared with)."""
        if self.tool is None:
            self.state["unavailable"] = "no amd-smi or nvidia-smi found"
            self._save()
            return
        try:
            self.baseline = self.tool.call()
        except ToolError as err:
            self._failed(err)
            return
        self._record("baseline", self.baseline)
        self._save()

    def sample_once(self) -> str:
        """Take one sample, compare it with the baseline; return the fault ('' when none)."""
        if self.tool is None:
            return ""
        try:
            gpus = self.tool.call()
        except ToolError as err:
            self._failed(err)
            return ""
        self._record("sample", gpus)
        if self.baseline is None:  # the baseline call failed: the first good sample stands in for it
            self.baseline = gpus
        faults = gpu_faults(self.baseline, gpus)
        if faults:
            self.fault = "; ".join(faults)
            self.state["fault_at"] = _now()
        self._save()
        return self.fault

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s):
            if self.tool is None or self.sample_once():
                return

    def start(self) -> None:
        """Take the baseline, then sample in a daemon thread until :meth:`stop`."""
        self.take_baseline()
        self._thread = threading.Thread(target=self._loop, name="mift-gpu-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop sampling; kill a tool call in flight."""
        self._stop.set()
        if self.tool is not None:
            self.tool.kill()
        if self._thread is not None:
            self._thread.join(timeout=5)


def status_fields(run_dir: Path) -> dict[str, Any]:
    """Return the telemetry part of the agent's ``status``: the latest sample's summary, warning, fault."""
    state = read_json(run_dir / TELEMETRY_STATE)
    if not state:
        return {}
    return {
        "gpu": state.get("latest"),
        "telemetry_warning": state.get("warning"),
        "gpu_fault": state.get("fault"),
    }


def after_check(run_dir: Path, proc_root: Path = Path("/proc")) -> dict[str, Any]:
    """After the run: no process on the GPUs, no new uncorrectable ECC error, every GPU of the baseline
    there. Writes and returns ``gpu_after.json`` (``ok``, ``problems``); the ECC and GPU checks need a
    baseline (telemetry on) and a tool that answered during the run."""
    done = read_json(run_dir / AFTER_FILE)
    if done:
        return done
    problems = [f"process on a GPU: {p}" for p in gpu_processes(proc_root)]
    state = read_json(run_dir / TELEMETRY_STATE)
    baseline = _baseline(run_dir)
    checked = ["processes"]
    usable = state and not state.get("unavailable") and "off for this run" not in str(state.get("warning"))
    tool = Tool.find() if baseline and usable else None
    if tool is not None:
        try:
            gpus = tool.call()
        except ToolError as err:
            problems.append(f"GPUs not checked: {err}")
        else:
            checked.append("ecc")
            problems.extend(gpu_faults(baseline, gpus))
    result = {"ok": not problems, "problems": problems, "checked": checked, "t": _now()}
    write_json(run_dir / AFTER_FILE, result)
    return result


def _baseline(run_dir: Path) -> list[dict[str, Any]]:
    try:
        with (run_dir / TELEMETRY_FILE).open() as fh:
            first = fh.readline()
        line = json.loads(first)
    except (OSError, ValueError):
        return []
    gpus = line.get("gpus") if isinstance(line, dict) else None
    return gpus if isinstance(gpus, list) else []
