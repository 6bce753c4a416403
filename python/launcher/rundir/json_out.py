"""``--json`` of ``status``, ``list``, ``check`` and ``logs``: one schema, the run record's own types.

Every object has ``schema`` (:data:`SCHEMA`, raised when a key changes meaning or goes away; new keys may be
added within a version) and ``kind`` (``run``, ``log``, ``check``). Keys are always present (null when
unknown), so a script reads them without guessing. docs/launcher.md "JSON output" is the reference.

* ``run`` (``status --json``: one object; ``list --json``: one per line, oldest first): the record's fields
  (launcher.runs.RunRecord) as stored in ``record.json``, plus ``final`` and ``run_dir``.
* ``log`` (``logs --json``, ``logs --follow --json``: one per line, as the lines come): one line of a node's
  trainer.log, its global rank when torchrun's prefix names it.
* ``check`` (``check --json``: one object): the node, GPU and link results and the bad lines.
"""

from __future__ import annotations

import json
import re
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from launcher.rundir.runs import RunDir, RunRecord

SCHEMA = 1
# the keys of a ``run`` object, in the order printed (a test reads them back: tests/unit/test_json_out.py)
RUN_KEYS = (
    "schema",
    "kind",
    "run_id",
    "status",
    "final",
    "name",
    "created_at",
    "backend",
    "hosts",
    "nproc_per_node",
    "output_dir",
    "result_reason",
    "failure_cause",
    "attempts",
    "lease",
    "summary",
    "nodes",
    "timeline",
    "run_dir",
)
LOG_KEYS = ("schema", "kind", "run_id", "host", "rank", "line")
_RANK_PREFIX_RE = re.compile(r"^\[rank(\d+) local\d+\]: ")


def run_object(record: RunRecord, run: RunDir) -> dict[str, Any]:
    """Return the ``run`` object of one run (its record as stored, typed where the record is)."""
    data = record.data
    return {
        "schema": SCHEMA,
        "kind": "run",
        "run_id": record.run_id or run.run_id,
        "status": record.status,
        "final": record.final,
        "name": record.name,
        "created_at": record.created_at,
        "backend": record.backend or "ssh",
        "hosts": list(record.hosts),
        "nproc_per_node": record.nproc_per_node,
        "output_dir": record.output_dir,
        "result_reason": record.result_reason or None,
        "failure_cause": data.get("failure_cause") if isinstance(data.get("failure_cause"), dict) else None,
        "attempts": [dict(a) for a in record.attempts],
        "lease": data.get("lease") if isinstance(data.get("lease"), dict) else None,
        "summary": dict(record.summary) or None,
        "nodes": {host: dict(node) for host, node in record.nodes.items()},
        "timeline": [t for t in data.get("timeline") or [] if isinstance(t, dict)],
        "run_dir": str(run.path),
    }


def log_objects(run_id: str, host: str, text: str) -> list[dict[str, Any]]:
    """Return one ``log`` object per line of ``text`` (whole lines of a node's trainer.log)."""
    out = []
    for line in text.splitlines():
        match = _RANK_PREFIX_RE.match(line)
        out.append(
            {
                "schema": SCHEMA,
                "kind": "log",
                "run_id": run_id,
                "host": host,
                "rank": int(match.group(1)) if match else None,
                "line": line,
            }
        )
    return out


def check_object(
    *,
    nodes: list[dict[str, Any]],
    gpus: dict[str, dict[str, Any]],
    links: list[str],
    links_from: str,
    notes: list[str],
    warnings: list[str],
    bad: list[str],
    seconds: float,
) -> dict[str, Any]:
    """Return the ``check`` object (``links``: the table's lines; the cache file holds the figures)."""
    return {
        "schema": SCHEMA,
        "kind": "check",
        "passed": not bad,
        "nodes": nodes,
        "gpus": gpus,
        "links": links,
        "links_from": links_from,
        "notes": notes,
        "warnings": warnings,
        "bad": bad,
        "seconds": round(seconds, 1),
    }


def write(obj: dict[str, Any], out: IO[str]) -> None:
    """Print ``obj`` as one line of JSON (its keys in the order built)."""
    out.write(json.dumps(obj, default=str) + "\n")
    out.flush()
