"""The job's tokenizer, loaded on the first node by preflight's probe: a missing package is one line before
the start.

LLaMA-Factory declares sentencepiece, tiktoken and protobuf for tokenizers (the node stack pins them:
requirements/node-cpu.txt); a node venv without one fails every trainer at start with a traceback per rank.
The probe (``mift_node.pyz probe --tokenizer``) loads ``AutoTokenizer.from_pretrained(model,
local_files_only=True)`` in the node venv when the folder holds more than ``tokenizer.json`` (a sentencepiece
or tiktoken file, or remote code); this module turns its answer into the refusal.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Mapping

# what transformers (and the libraries it imports) say when a tokenizer package is missing
_NEEDS = (
    re.compile(r"requires the ([A-Za-z][\w-]*) library", re.IGNORECASE),
    re.compile(r"No module named '([\w.]+)'"),
    re.compile(
        r"`?(sentencepiece|tiktoken|protobuf)`? (?:is|are) (?:required|needed|not installed)", re.IGNORECASE
    ),
    re.compile(r"install (sentencepiece|tiktoken|protobuf)\b", re.IGNORECASE),
)
# module or library name -> the package to install
_PACKAGE = {
    "sentencepiece": "sentencepiece",
    "google": "protobuf",
    "protobuf": "protobuf",
    "tiktoken": "tiktoken",
}


def missing_package(error: str) -> str | None:
    """The package a tokenizer error says is missing (``sentencepiece``, ``protobuf``, ...), or None."""
    for pattern in _NEEDS:
        found = pattern.search(error)
        if found:
            name = found.group(1).lower().split(".")[0]
            return _PACKAGE.get(name, name)
    return None


def tokenizer_refusal(host: str, answer: Mapping[str, Any] | None) -> str | None:
    """One line when the probe could not load the job's tokenizer on ``host``; None when it loaded, was not
    loaded (``tokenizer.json`` only) or was not asked."""
    if not answer or answer.get("ok"):
        return None
    model = answer.get("model") or "the model folder"
    error = str(answer.get("error") or "no answer").strip()
    first = error.splitlines()[0] if error else "no answer"
    package = missing_package(error)
    if package is not None:
        return (
            f"{host}: the job's tokenizer ({model}) does not load: it needs the Python package {package}, "
            "which the node venv lacks; provision the stack again (ansible-playbook provision.yml --tags "
            f"stack) or install it there (pip install {package}); nothing was started"
        )
    return (
        f"{host}: the job's tokenizer ({model}) does not load in the node venv: {first}; nothing was started"
    )
