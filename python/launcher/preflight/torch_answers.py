"""The controller's copy of what each node's torch reported, so that preflight asks torch once per change.

Starting torch on a node costs seconds on every ``run`` (tens of seconds with CUDA or ROCm initialisation).
What torch reports depends on the node's boot, its GPU device nodes, the visible-devices variables, the
trainer's interpreter and torch's installation: the probe turns those into a key without starting an
interpreter (``mift_probe.torch_key``). Preflight sends each node the key of the answer held here; a node
whose key is unchanged answers ``{"cached": true, "key": ...}`` and the held answer stands in. Kept as JSON
in ``<cache root>/torch-probe.json`` (:func:`launcher.validation.cache.cache_root`); an unreadable file
counts as empty, one that cannot be written is skipped. Only answers without an error are kept.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.validation.cache import cache_root

if TYPE_CHECKING:
    from collections.abc import Mapping

FILE_NAME = "torch-probe.json"


class TorchAnswers:
    """Host -> (key, torch answer), read once per ``run``, written back when an answer changed."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or cache_root() / FILE_NAME
        self.entries: dict[str, dict[str, Any]] = _read(self.path)

    def known(self) -> dict[str, str]:
        """Return host -> the key of the answer held for it (sent to the nodes)."""
        return {host: str(entry["key"]) for host, entry in self.entries.items()}

    def resolve(self, answers: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
        """Return host -> torch answer: a node's ``cached`` reply replaced by the held answer, a fresh answer
        remembered (an answer with an error forgets the host)."""
        out: dict[str, dict[str, Any]] = {}
        changed = False
        for host, answer in answers.items():
            key, held = answer.get("key"), self.entries.get(host)
            if answer.get("cached"):
                if held is not None and held["key"] == key:
                    out[host] = {**held["answer"], "cached": True}
                else:  # a node must only answer "cached" to the key it was sent: never trust it otherwise
                    out[host] = {"error": "answered from a torch answer the controller does not hold"}
                continue
            out[host] = dict(answer)
            if key and not answer.get("error"):
                changed |= held != {"key": key, "answer": dict(answer)}
                self.entries[host] = {"key": key, "answer": dict(answer)}
            elif held is not None:
                del self.entries[host]
                changed = True
        if changed:
            _write(self.path, self.entries)
        return out


def _read(path: Path) -> dict[str, dict[str, Any]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {
        str(host): entry
        for host, entry in data.items()
        if isinstance(entry, dict)
        and isinstance(entry.get("key"), str)
        and isinstance(entry.get("answer"), dict)
    }


def _write(path: Path, entries: Mapping[str, Any]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(entries, fh)
        Path(tmp).replace(path)
    except OSError:
        return
