"""The cause of a failed run, read on the controller from its ranks' stderr logs.

A trainer that fails is reported by the judge as ``host2: trainer exited rc=1``: torchrun's and
``CalledProcessError``'s wrappers say that a rank failed, not why. The why is the rank's own Python exception,
at the end of ``nodes/<host>/rank<N>.stderr.log`` (torchrun's per-rank logs, collected by ``finalize``).
:func:`find_cause` reads every rank's log and returns the exception of the rank that raised first: its type
and message (the last exception of its last traceback, a wrapper skipped), the host and rank, and the log to
read. Errors a rank raises because a peer went away (a closed gloo connection, a collective that timed out)
rank after a rank's own error: they are what the cause did to the others.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Sequence

RANK_STDERR_RE = re.compile(r"^rank(\d+)\.stderr\.log$")
# torchrun's prefixes of the teed lines (launcher/node/common.py RANK_LOG_PREFIX, then PyTorch's own
# ``[rankN]:``), and its default one
_PREFIX_RE = re.compile(r"^(?:\[(?:rank\d+(?: local\d+)?|default\d+)\]:\s?)+")
_TRACEBACK = "Traceback (most recent call last):"
_DIRECT_CAUSE = "The above exception was the direct cause"
# a raised exception's line: a dotted class name, then ``: message`` or nothing
_EXCEPTION_RE = re.compile(r"^([A-Za-z_][\w.]*)(?::\s?(.*))?$")
# wrappers that say a child failed, never why (torchrun's elastic agent, LLaMA-Factory's launcher)
WRAPPERS = frozenset({"ChildFailedError", "CalledProcessError", "SignalException"})
# what a rank raises when a peer is gone: a consequence of another rank's failure
_PEER_RE = re.compile(
    r"Connection closed by peer|Connection reset by peer|Broken pipe|DistBackendError|DistNetworkError|"
    r"remote process exited|Socket Timeout|Timed out waiting|timed out after|NCCL communicator was aborted|"
    r"ProcessGroupGloo|gloo/transport",
    re.IGNORECASE,
)
MESSAGE_CHARS = 240  # a message longer than this is cut (the log holds it whole)


@dataclass(frozen=True)
class RankError:
    """The exception one rank's stderr log ends with."""

    type: str  # as Python printed it (``ValueError``, ``huggingface_hub.errors.LocalEntryNotFoundError``)
    message: str  # its message, on one line, cut at MESSAGE_CHARS
    causes: tuple[str, ...] = ()  # ``Type: message`` of what it was raised from, the nearest first

    @property
    def from_peer(self) -> bool:
        """Return True when this error is what a peer's failure did to this rank."""
        return bool(_PEER_RE.search(f"{self.type}: {self.message}"))


@dataclass(frozen=True)
class Cause:
    """The exception of the rank that failed first: what, where, and the log to read."""

    type: str
    message: str
    host: str
    rank: int
    log: str  # the rank's log, relative to the run directory (``nodes/host2/rank1.stderr.log``)
    at: float  # when the log was last written (its mtime, kept by the collect archive)
    ranks_failed: int  # how many ranks' logs end with an exception
    causes: tuple[str, ...] = ()  # what it was raised from (``raise ... from err``), the nearest first

    def text(self, run_path: Path | None = None) -> str:
        """Return ``Type: message <- Cause: message (raised first by host2 rank 1, then 3 more; read L)``."""
        log = str(run_path / self.log) if run_path is not None else self.log
        others = f", then {self.ranks_failed - 1} more" if self.ranks_failed > 1 else ""
        where = f"raised first by {self.host} rank {self.rank}{others}"
        chain = "".join(f" <- {c}" for c in self.causes)
        return f"{self.type}: {self.message}{chain} ({where}; read {log})"

    def as_record(self) -> dict[str, Any]:
        """Return the record's ``failure_cause`` (docs/launcher.md "JSON output")."""
        return {
            "type": self.type,
            "message": self.message,
            "host": self.host,
            "rank": self.rank,
            "log": self.log,
            "at": round(self.at, 3),
            "ranks_failed": self.ranks_failed,
            "causes": list(self.causes),
        }


def _unprefixed(text: str) -> list[str]:
    return [_PREFIX_RE.sub("", line.rstrip("\r")) for line in text.splitlines()]


def _exception_at(lines: list[str], start: int) -> tuple[RankError | None, int]:
    """Return the exception a traceback starting at ``lines[start]`` ends with, and the index after it."""
    i = start + 1
    while i < len(lines) and (lines[i].startswith((" ", "\t")) or not lines[i].strip()):
        i += 1  # frames, source lines, carets
    if i >= len(lines):
        return None, i
    match = _EXCEPTION_RE.match(lines[i].strip())
    if not match:
        return None, i + 1
    kind, text = match.group(1), (match.group(2) or "").strip()
    j = i + 1
    if not text and j < len(lines) and lines[j].strip() and lines[j] != _TRACEBACK:
        text = lines[j].strip()  # a message that starts on the next line
        j += 1
    if len(text) > MESSAGE_CHARS:
        text = text[: MESSAGE_CHARS - 3].rstrip() + "..."
    return RankError(kind, text), j


def last_exception(text: str) -> RankError | None:
    """Return the exception a rank's stderr ends with: the last exception of its tracebacks that is not a
    wrapper (``ChildFailedError``, ``CalledProcessError``), with the exceptions it was raised from (``raise
    ... from err``: Python's "The above exception was the direct cause" chain) as its ``causes``; None when
    the log holds no traceback."""
    lines = _unprefixed(text)
    found: list[tuple[RankError, bool]] = []  # each exception, and whether the one before caused it directly
    direct = False
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        if line == _TRACEBACK:
            error, i = _exception_at(lines, i)
            if error is not None and error.type.rsplit(".", 1)[-1] not in WRAPPERS:
                found.append((error, direct))
            direct = False
            continue
        if line.startswith(_DIRECT_CAUSE):
            direct = True
        i += 1
    if not found:
        return None
    last, causes = len(found) - 1, []
    while found[last][1] and last > 0:  # walk back the direct causes
        last -= 1
        causes.append(f"{found[last][0].type}: {found[last][0].message}")
    error = found[-1][0]
    return RankError(error.type, error.message, tuple(causes))


def find_cause(run_path: Path, hosts: Sequence[str]) -> Cause | None:
    """Return the exception of the rank that failed first, from ``run_path/nodes/<host>/rank<N>.stderr.log``
    (``hosts`` in inventory order, which breaks ties); None when no rank's log ends with an exception of its
    own (a rank killed by a signal prints none: the judge's line says so)."""
    seen: list[tuple[bool, float, int, int, str, RankError, Path]] = []
    for order, host in enumerate(hosts):
        folder = run_path / "nodes" / host
        if not folder.is_dir():
            continue
        for log in folder.iterdir():
            match = RANK_STDERR_RE.match(log.name)
            if not match or not log.is_file():
                continue
            try:
                error = last_exception(log.read_text(errors="replace"))
                mtime = log.stat().st_mtime
            except OSError:
                continue
            if error is not None:
                seen.append((error.from_peer, mtime, order, int(match.group(1)), host, error, log))
    if not seen:
        return None
    from_peer, mtime, _, rank, host, error, log = min(seen, key=lambda s: s[:4])
    if from_peer:
        return None  # only what a lost peer did: the cause is elsewhere (a signal, a lost node)
    return Cause(
        type=error.type,
        message=error.message,
        host=host,
        rank=rank,
        log=str(log.relative_to(run_path)),
        at=mtime,
        ranks_failed=len(seen),
        causes=error.causes,
    )


def with_cause(reason: str, cause: Cause | None, run_path: Path) -> str:
    """Return the failure line ``reason`` with the cause after it (``reason`` alone when there is none)."""
    if cause is None:
        return reason
    if not reason:
        return cause.text(run_path)
    # the judge's ``host: trainer exited rc=N``, the cause, then what followed (``; not retried: ...``)
    head, sep, rest = reason.partition("; ")
    return f"{head}: {cause.text(run_path)}{sep}{rest}"


def in_last_attempt(attempts: object, cause: Cause, run_path: Path) -> list[dict[str, Any]]:
    """Return the record's ``attempts`` with ``cause`` (its text) in the last one (the attempt that ended)."""
    out = [dict(a) for a in attempts if isinstance(a, dict)] if isinstance(attempts, list) else []
    if out:
        out[-1]["cause"] = cause.text(run_path)
    return out
