"""Staging: every node holds a verified copy of the job's model and dataset folders before the trainers start.

One pass (docs/launcher.md "Staging"): the job spec's ``stage`` names each folder by its source; its
destination on the nodes is the training YAML's own path (``model_name_or_path``, ``dataset_dir``). The
controller makes a manifest (size and sha256 per file; hashes cached by size/mtime/ctime/inode,
:mod:`launcher.node.stage`), each node reports what it holds (one playbook, ``playbooks/stage.yml``),
free disk is checked, and only the files that differ are sent, over the ssh Ansible uses, to every node in
parallel; the node writes each to a partial name and renames it only when its sha256 matches. The manifests
(and their digest) go into the run record.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from launcher.exceptions import ConfigurationError, JobFailedError
from launcher.node import stage as mift_stage
from launcher.transfer import nodeprogram
from launcher.transfer.manifest import (
    PROGRESS_EVERY_S,
    Manifest,
    Send,
    StageItem,
    build_manifest,
    controller_cache,
    disk_shortfall,
    extra_files,
    files,
    human,
    shared_differences,
    stage_items,
    to_send,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from launcher.backends.runner import PlaybookRunner
    from launcher.validation.job import LoadedJob


def ssh_argv(connection: str, ssh: Mapping[str, Any]) -> list[str]:
    """The command prefix that reaches a node as Ansible does (its host, port, user, key and ssh args)."""
    if connection == "local":
        return []
    argv = ["ssh", "-o", "BatchMode=yes", "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3"]
    if str(ssh.get("port") or ""):
        argv += ["-p", str(ssh["port"])]
    if ssh.get("user"):
        argv += ["-l", str(ssh["user"])]
    if ssh.get("key"):
        argv += ["-i", str(ssh["key"])]
    argv += shlex.split(str(ssh.get("common_args") or "")) + shlex.split(str(ssh.get("extra_args") or ""))
    return [*argv, str(ssh["host"])]


@dataclass
class HostTransfer:
    """The files one node gets, sent over one ssh connection by one thread; counters for the progress line."""

    host: str
    argv: list[str]
    dests: list[str]
    sends: list[Send]
    sent: int = 0
    done_files: int = 0
    results: list[dict[str, Any]] = field(default_factory=list)
    error: str = ""
    rc: int | None = None
    proc: subprocess.Popen[bytes] | None = None

    @property
    def total(self) -> int:
        return sum(s.size - s.offset for s in self.sends)

    def command(self, cache: str) -> list[str]:
        # the node program is on the node: playbooks/stage.yml sent it just before (ansible_connection local:
        # no ssh, the controller's copy)
        python = sys.executable if not self.argv else "python3"
        return nodeprogram.command(
            self.argv, python, "stage", "recv", "--cache", cache, *self.dests, ship=False
        )

    def run(self, cache: str, stop: threading.Event) -> None:
        """Send every file, then read the node's verdicts; never raises (``error`` says what went wrong)."""
        try:
            self._run(cache, stop)
        except Exception as err:
            self.error = self.error or f"{type(err).__name__}: {err}"

    def _run(self, cache: str, stop: threading.Event) -> None:
        self.proc = proc = subprocess.Popen(
            self.command(cache), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        reader = threading.Thread(target=self._read, args=(proc.stdout,), daemon=True)
        reader.start()
        try:
            for send in self.sends:
                if stop.is_set():
                    break
                self._send(proc.stdin, send)
            proc.stdin.write(b'{"end": true}\n')
            proc.stdin.close()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the node stopped reading (disk full): its last line says why
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=600)
        reader.join(timeout=10)
        self.rc = proc.returncode
        stderr = proc.stderr.read().decode(errors="replace").strip()
        if self.rc not in (0, mift_stage.DISK_FULL_RC) and not self.error:
            last = stderr.splitlines()[-1] if stderr else f"exit {self.rc}"
            self.error = f"receiving failed: {last}"

    def _send(self, pipe: IO[bytes], send: Send) -> None:
        header = {
            "dest": send.dest,
            "path": send.rel,
            "size": send.size,
            "sha256": send.sha256,
            "offset": send.offset,
            "mode": send.mode,
        }
        pipe.write(json.dumps(header).encode() + b"\n")
        left = send.size - send.offset
        with send.src.open("rb") as fh:
            fh.seek(send.offset)
            while left > 0:
                chunk = fh.read(min(mift_stage.CHUNK, left))
                if not chunk:  # the source shrank since its manifest: keep the stream framed (node refuses)
                    chunk = b"\0" * min(mift_stage.CHUNK, left)
                pipe.write(chunk)
                left -= len(chunk)
                self.sent += len(chunk)

    def _read(self, stdout: IO[bytes]) -> None:
        for line in stdout:
            with contextlib.suppress(ValueError):
                result = json.loads(line)
                self.results.append(result)
                if result.get("ok"):
                    self.done_files += 1


def _failure(transfer: HostTransfer, cache: mift_stage.HashCache) -> str | None:
    """The one line saying why a node did not get every file verified, or None."""
    by_rel = {(s.dest, s.rel): s for s in transfer.sends}
    for result in transfer.results:
        if result.get("ok"):
            continue
        dest = transfer.dests[int(result.get("dest", 0))]
        if result.get("error") == "disk full":
            return (
                f"{transfer.host}: {dest}: disk full while receiving {result.get('path')} "
                f"(No space left on device: {human(int(result.get('free') or 0))}, "
                f"{result.get('inodes', '?')} inodes free): its partial file was removed; "
                f"{transfer.done_files} of {len(transfer.sends)} files written, each verified"
            )
        send = by_rel.get((int(result.get("dest", 0)), str(result.get("path"))))
        if send is not None:
            try:
                now = mift_stage.hash_file(send.src, cache)
            except (OSError, mift_stage.ChangedWhileHashingError):
                now = "(unreadable or changing)"
            if now != send.sha256:
                return (
                    f"{transfer.host}: {dest}/{send.rel}: checksum mismatch at the source: {send.src} "
                    f"changed after its manifest was made (sha256 {send.sha256[:12]} -> {now[:12]}); not "
                    f"written on {transfer.host}; run again to stage the new content"
                )
        return f"{transfer.host}: {dest}/{result.get('path')}: {result.get('error')}"
    if transfer.error:
        return f"{transfer.host}: {transfer.error}"
    if transfer.done_files != len(transfer.sends):
        missing = len(transfer.sends) - transfer.done_files
        return f"{transfer.host}: {missing} files were not confirmed by the node"
    return None


@dataclass
class StageOutcome:
    """What staging did, for the run record."""

    manifests: list[Manifest]
    sent: dict[str, dict[str, int]]
    seconds: float
    extra: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    # host -> the ssh prefix that reaches it as Ansible does (empty: a local node), in rank order
    connections: dict[str, list[str]] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        return {
            "items": [m.record() for m in self.manifests],
            "sent": self.sent,
            "seconds": round(self.seconds, 2),
            **({"extra_files": self.extra} if self.extra else {}),
        }


def _node_reports(
    runner: PlaybookRunner, host_pattern: str, items: list[StageItem], node_cache: str
) -> tuple[list[str], dict[str, dict[str, Any]]]:
    result = runner.run(
        "stage",
        {
            "mift_hosts": host_pattern,
            "mift_stage_dests": [i.dest for i in items],
            "mift_stage_cache": node_cache,
        },
    )
    if runner.cancel_requested.is_set():
        raise JobFailedError("interrupted while staging; nothing was started")
    if result.failures:
        host, line = next(iter(result.failures.items()))
        raise ConfigurationError(f"{host}: staging report failed: {line}; nothing was sent")
    return result.host_reports("stage", host_pattern)


def stage(
    job: LoadedJob,
    runner: PlaybookRunner,
    *,
    out: IO[str],
    progress: Callable[[dict[str, Any]], object] | None = None,
    stop: threading.Event | None = None,
) -> StageOutcome | None:
    """Make every node of the job hold a verified copy of the job's staged folders; None when it stages none.

    Bad input (a missing source, a file changing at the source, too little free disk) raises
    :class:`ConfigurationError` before anything is sent; a failed transfer raises :class:`JobFailedError`.
    ``progress`` gets ``{host: {"bytes", "total", "rate"}}`` every few seconds while files are sent.
    """
    items = stage_items(job)
    if not items:
        return None
    stop = stop or threading.Event()
    t0 = time.monotonic()
    cache = controller_cache()
    manifests: dict[str, Manifest] = {}
    for item in items:
        if item.kind != "shared":
            manifests[item.key] = _announce(build_manifest(item, cache), t0, out)
    t_report = time.monotonic()
    hosts, reports = _node_reports(runner, job.spec.host_pattern, items, job.spec.stage.node_cache)
    for item in items:
        if item.kind == "shared":  # the first node's view is the manifest; every node must see the same
            first = reports[hosts[0]]["held"][item.dest]
            if not first.get("files"):
                raise ConfigurationError(f"{hosts[0]}: {item.label}: {item.dest}: no files there")
            manifests[item.key] = _announce(Manifest(item, first["files"]), t0, out)
    ordered = [manifests[i.key] for i in items]
    print(
        f"staging: {len(hosts)} nodes reported what they hold in {time.monotonic() - t_report:.1f} s",
        file=out,
        flush=True,
    )
    transfers, extra = _plan_transfers(ordered, hosts, reports)
    for host, left in extra.items():
        for dest, names in left.items():
            print(f"note: {host}: {dest}: {len(names)} files not in the manifest left in place", file=out)
    sent = _send_verified(transfers, job.spec.stage.node_cache, cache, stop=stop, out=out, progress=progress)
    seconds = time.monotonic() - t0
    _print_done(ordered, sent, hosts, seconds, out)
    connections = {h: ssh_argv(str(reports[h]["connection"]), reports[h]["ssh"]) for h in hosts}
    return StageOutcome(ordered, sent, seconds, extra, connections)


def node_connections(runner: PlaybookRunner, host_pattern: str, node_cache: str) -> dict[str, list[str]]:
    """host -> the ssh prefix that reaches it as Ansible does, in rank order (one playbook, no hashing)."""
    hosts, reports = _node_reports(runner, host_pattern, [], node_cache)
    return {h: ssh_argv(str(reports[h]["connection"]), reports[h]["ssh"]) for h in hosts}


def send_folders(
    runner: PlaybookRunner,
    host_pattern: str,
    manifests: list[Manifest],
    node_cache: str,
    *,
    out: IO[str],
    stop: threading.Event,
) -> dict[str, dict[str, int]]:
    """Stage controller folders whose manifests are made to every node, as :func:`stage` does (only the files
    a node lacks, verified); returns what each node was sent."""
    t0 = time.monotonic()
    hosts, reports = _node_reports(runner, host_pattern, [m.item for m in manifests], node_cache)
    transfers, _extra = _plan_transfers(manifests, hosts, reports)
    sent = _send_verified(transfers, node_cache, controller_cache(), stop=stop, out=out, progress=None)
    _print_done(manifests, sent, hosts, time.monotonic() - t0, out)
    return sent


def _send_verified(
    transfers: list[HostTransfer],
    node_cache: str,
    cache: mift_stage.HashCache,
    *,
    stop: threading.Event,
    out: IO[str],
    progress: Callable[[dict[str, Any]], object] | None,
) -> dict[str, dict[str, int]]:
    """Send every transfer (in parallel), then raise the first failure; return host -> files, bytes sent."""
    _send_all(transfers, node_cache, stop, out, progress)
    failures = [line for t in transfers if (line := _failure(t, cache))]
    cache.save()
    if stop.is_set():
        raise JobFailedError("interrupted while staging; files sent so far are complete and verified")
    if failures:
        raise JobFailedError(failures[0])
    return {t.host: {"files": len(t.sends), "bytes": t.total} for t in transfers}


def _announce(manifest: Manifest, t0: float, out: IO[str]) -> Manifest:
    m = manifest
    print(
        f"staging: {m.item.key} from {m.item.kind} {m.item.source} -> {m.item.dest}: "
        f"{files(len(m.files))}, {human(m.total_bytes)}, manifest {m.digest[:19]} "
        f"({time.monotonic() - t0:.1f} s)",
        file=out,
        flush=True,
    )
    return m


def _plan_transfers(
    manifests: list[Manifest], hosts: list[str], reports: Mapping[str, Mapping[str, Any]]
) -> tuple[list[HostTransfer], dict[str, dict[str, list[str]]]]:
    """Per node, the files that differ (free disk checked first: bad input raises before anything is sent),
    and the files a node holds that no manifest names."""
    dests = [m.item.dest for m in manifests]
    transfers: list[HostTransfer] = []
    extra: dict[str, dict[str, list[str]]] = {}
    for host in hosts:
        held = reports[host]["held"]
        sends: list[Send] = []
        for index, m in enumerate(manifests):
            if m.item.kind == "shared":
                diffs = shared_differences(m, held[m.item.dest])
                if diffs:
                    raise ConfigurationError(
                        f"{host}: {m.item.label}: {m.item.dest}: {diffs[0]} differs from {hosts[0]}'s "
                        f"({len(diffs)} files differ): the nodes do not see the same shared folder"
                    )
                continue
            sends += to_send(m, held[m.item.dest], index)
            if left := extra_files(m, held[m.item.dest]):
                extra.setdefault(host, {})[m.item.dest] = left
        short = disk_shortfall(held, dests, sends)
        if short:
            raise ConfigurationError(f"{host}: {short}; nothing was sent")
        if sends:
            argv = ssh_argv(str(reports[host]["connection"]), reports[host]["ssh"])
            transfers.append(HostTransfer(host, argv, dests, sends))
    return transfers, extra


def _send_all(
    transfers: list[HostTransfer],
    node_cache: str,
    stop: threading.Event,
    out: IO[str],
    progress: Callable[[dict[str, Any]], object] | None,
) -> None:
    threads = [threading.Thread(target=t.run, args=(node_cache, stop), daemon=True) for t in transfers]
    t0 = time.monotonic()
    for thread in threads:
        thread.start()
    while any(t.is_alive() for t in threads):
        for thread in threads:
            thread.join(timeout=PROGRESS_EVERY_S / max(len(threads), 1))
        if stop.is_set():
            for t in transfers:
                if t.proc is not None and t.proc.poll() is None:
                    t.proc.kill()
        if any(t.is_alive() for t in threads):
            elapsed = max(time.monotonic() - t0, 1e-6)
            state = {t.host: {"bytes": t.sent, "total": t.total, "rate": t.sent / elapsed} for t in transfers}
            print("staging: " + progress_line(state), file=out, flush=True)
            if progress is not None:
                progress(state)


def progress_line(state: Mapping[str, Mapping[str, float]]) -> str:
    """``host1 1.2 MB/3.4 MB (35%) 2.0 MB/s ETA 1 s | host2 ...``."""
    parts = []
    for host, s in state.items():
        total, done, rate = float(s["total"]), float(s["bytes"]), float(s["rate"])
        pct = 100 * done / total if total else 100.0
        eta = f" ETA {(total - done) / rate:.0f} s" if rate > 0 and done < total else ""
        parts.append(f"{host} {human(done)}/{human(total)} ({pct:.0f}%) {human(rate)}/s{eta}")
    return " | ".join(parts)


def _print_done(
    manifests: list[Manifest], sent: dict[str, dict[str, int]], hosts: list[str], seconds: float, out: IO[str]
) -> None:
    held = ", ".join(f"{m.item.key} {m.digest[:19]}" for m in manifests)
    if not sent:
        print(
            f"staged in {seconds:.1f} s: every node already held {held}; nothing sent", file=out, flush=True
        )
        return
    total = sum(s["bytes"] for s in sent.values())
    each = ", ".join(f"{h} {files(sent[h]['files'])} {human(sent[h]['bytes'])}" for h in hosts if h in sent)
    others = [h for h in hosts if h not in sent]
    print(
        f"staged in {seconds:.1f} s: sent {human(total)} ({each}; {human(total / max(seconds, 1e-6))}/s)"
        + (f"; {', '.join(others)} already held it" if others else "")
        + f"; every node holds {held}",
        file=out,
        flush=True,
    )


def write_manifests(run_path: Path, outcome: StageOutcome) -> None:
    """Keep each manifest's file list in the run directory: ``staging/<key>.manifest.json``."""
    folder = run_path / "staging"
    folder.mkdir(exist_ok=True, mode=0o700)
    for m in outcome.manifests:
        (folder / f"{m.item.key}.manifest.json").write_text(
            json.dumps(
                {**m.record(), "manifest": {rel: dict(m.files[rel]) for rel in sorted(m.files)}}, indent=1
            )
            + "\n"
        )
