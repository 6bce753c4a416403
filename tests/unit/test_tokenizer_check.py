"""The job's tokenizer on the first node: the probe's answer (mift_probe.tokenizer_check) and its refusal line
(launcher.preflight.tokenizer_check), and the node stack's tokenizer packages.

The error texts are transformers' own (its import_utils constants, read from the installed package) and one
real load in this venv, which has no sentencepiece and no tiktoken installed: the probe's own function runs
it.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

from launcher.node import probe as mift_probe
from launcher.preflight.checks import node_paths
from launcher.preflight.tokenizer_check import missing_package, tokenizer_refusal

ROOT = Path(__file__).resolve().parents[2]


def _transformers_error(name: str) -> str:
    from transformers.utils import import_utils  # noqa: PLC0415

    return str(getattr(import_utils, name)).format("LlamaTokenizer")


@pytest.mark.parametrize(
    ("error", "package"),
    [
        (lambda: _transformers_error("SENTENCEPIECE_IMPORT_ERROR"), "sentencepiece"),
        (lambda: _transformers_error("PROTOBUF_IMPORT_ERROR"), "protobuf"),
        (
            lambda: (
                "ValueError: `tiktoken` is required to read a `tiktoken` file. Install it with `pip install "
                "tiktoken`."
            ),
            "tiktoken",
        ),
        (lambda: "ModuleNotFoundError: No module named 'google.protobuf'", "protobuf"),
        (lambda: "ModuleNotFoundError: No module named 'sentencepiece'", "sentencepiece"),
        (lambda: "OSError: /models/x does not appear to have a file named tokenizer_config.json", None),
    ],
)
def test_the_missing_package_is_named(error, package) -> None:
    assert missing_package(error()) == package


def test_the_refusal_is_one_line_naming_host_model_and_package() -> None:
    answer = {
        "ok": False,
        "loaded": True,
        "model": "/models/m",
        "error": _transformers_error("PROTOBUF_IMPORT_ERROR"),
    }
    line = tokenizer_refusal("host1", answer)
    assert line is not None and "\n" not in line
    assert line.startswith(
        "host1: the job's tokenizer (/models/m) does not load: it needs the Python package protobuf"
    )
    assert line.endswith("nothing was started")
    other = tokenizer_refusal("host1", {"ok": False, "model": "/m", "error": "OSError: bad file\nmore"})
    assert (
        other == "host1: the job's tokenizer (/m) does not load in the node venv: OSError: bad file; "
        "nothing was started"
    )


@pytest.mark.parametrize("answer", [None, {}, {"ok": True, "loaded": False}, {"ok": True, "class": "X"}])
def test_no_refusal_when_it_loaded_or_was_not_asked(answer) -> None:
    assert tokenizer_refusal("host1", answer) is None


def test_a_fast_tokenizer_folder_is_not_loaded(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text("{}")
    assert mift_probe.tokenizer_check(Path(sys.prefix), tmp_path, False) == {
        "ok": True,
        "loaded": False,
        "model": str(tmp_path),
    }
    assert mift_probe.tokenizer_check(Path(sys.prefix), tmp_path / "absent", False) is None


@pytest.mark.skipif(
    importlib.util.find_spec("sentencepiece") is not None or importlib.util.find_spec("tiktoken") is not None,
    reason="this venv has sentencepiece or tiktoken: the missing-package load cannot be shown here",
)
def test_a_real_load_without_the_packages_is_refused_in_one_line(tmp_path: Path) -> None:
    # a sentencepiece model file: transformers needs sentencepiece (or tiktoken) to read it
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "LlamaTokenizer"}))
    (tmp_path / "tokenizer.model").write_bytes(bytes(range(256)) * 8)
    answer = mift_probe.tokenizer_check(Path(sys.prefix), tmp_path, False)
    assert answer is not None and answer["loaded"] is True and answer["ok"] is False
    line = tokenizer_refusal("host1", answer)
    assert line is not None
    assert re.match(
        r"host1: the job's tokenizer \(.*\) does not load: "
        r"it needs the Python package (sentencepiece|tiktoken)",
        line,
    )


def test_the_model_folder_asks_for_the_tokenizer_with_the_yamls_trust_remote_code() -> None:
    from launcher.spec.jobspec_load import load_job_spec_bytes  # noqa: PLC0415

    spec = load_job_spec_bytes(b"name: j\ntrain_config: t.yaml\nhosts: [n1]\n", ROOT / "job.yaml")
    (model,) = [
        p
        for p in node_paths({"model_name_or_path": "/m", "trust_remote_code": True}, spec, deepspeed=None)
        if p.what == "model_name_or_path"
    ]
    assert model.trust_remote_code is True
    assert "trust_remote_code" not in model.as_extravar()  # the probe's --require stays as it was


def test_the_node_stack_pins_llamafactorys_tokenizer_packages() -> None:
    pins = dict(
        line.strip().split("==", 1)
        for line in (ROOT / "requirements" / "node-cpu.txt").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    )
    for name in ("sentencepiece", "tiktoken", "protobuf"):
        assert name in pins, name
    try:
        import importlib.metadata as md  # noqa: PLC0415

        declared = {
            re.split(r"[<>=!~; \[]", r, maxsplit=1)[0].lower() for r in md.requires("llamafactory") or []
        }
    except md.PackageNotFoundError:
        pytest.skip("llamafactory not installed here")
    assert {"sentencepiece", "tiktoken", "protobuf"} <= declared
