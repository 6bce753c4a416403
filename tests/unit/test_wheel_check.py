"""The wheel check before the torch family is installed (roles/pytorch: mift_wheel_index, mift_wheel_check).

The index pages are written in the layout download.pytorch.org/whl/rocmX.Y/<name>/ serves (PEP 503 anchors,
``+`` escaped as ``%2B`` in hrefs); the file names follow the versions the project pins. They are not
captures of that index (there is no network here): which wheels really exist is for the check to find out.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "plugins" / "module_utils"))

import mift_wheel_index as wi  # noqa: E402

FILES = [
    "torch-2.11.0+rocm7.2-cp310-cp310-manylinux_2_28_x86_64.whl",
    "torch-2.11.0+rocm7.2-cp312-cp312-manylinux_2_28_x86_64.whl",
    "torch-2.12.0+rocm7.2-cp311-cp311-manylinux_2_28_x86_64.whl",
    "torch-2.12.0+rocm7.2-cp312-cp312-manylinux_2_28_x86_64.whl",
    "torch-2.12.0+rocm7.1-cp311-cp311-manylinux_2_28_x86_64.whl",
]


def page(files: list[str]) -> str:
    anchors = "".join(
        f'<a href="/whl/rocm7.2/{f.replace("+", "%2B")}#sha256=00">{f}</a><br/>\n' for f in files
    )
    return f"<!DOCTYPE html>\n<html><body>\n<h1>Links for torch</h1>\n{anchors}</body></html>\n"


def test_wheel_files_are_decoded_once_each() -> None:
    assert wi.wheel_files(page(FILES)) == FILES


def test_a_pin_exists_only_for_the_interpreters_it_was_built_for() -> None:
    files = wi.wheel_files(page(FILES))
    assert wi.has_wheel(files, "torch", "2.11.0+rocm7.2", "cp312")
    assert not wi.has_wheel(files, "torch", "2.11.0+rocm7.2", "cp311")


def test_what_to_pin_instead_keeps_the_rocm_label_newest_first() -> None:
    files = wi.wheel_files(page(FILES))
    assert wi.versions_for(files, "torch", "cp311", "rocm7.2") == ["2.12.0+rocm7.2"]
    assert wi.versions_for(files, "torch", "cp312") == ["2.12.0+rocm7.2", "2.11.0+rocm7.2"]


def test_the_rigs_own_index_page_is_read() -> None:
    # the layout tools/testhosts writes for its PyPI test double (relative hrefs, unescaped "+")
    text = (
        '<!DOCTYPE html><html><body>\n<a href="../../files/'
        'torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl#sha256=67">'
        "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl</a>\n</body></html>\n"
    )
    assert wi.has_wheel(wi.wheel_files(text), "torch", "2.13.0+cpu", "cp311")


@pytest.fixture
def index(tmp_path: Path) -> Iterator[str]:
    """A local HTTP index (TEST DOUBLE of download.pytorch.org/whl/rocm7.2) serving the page above."""
    (tmp_path / "idx" / "torch").mkdir(parents=True)
    (tmp_path / "idx" / "torch" / "index.html").write_text(page(FILES))
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path / "idx"))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def run_module(
    tmp_path: Path, index: str, pins: list[str], tags: dict[str, str]
) -> tuple[bool, dict[str, object]]:
    args = json.dumps({"index": index, "pins": pins, "tags_by_host": tags})
    ansible = str(Path(sys.executable).parent / "ansible")
    proc = subprocess.run(
        [ansible, "localhost", "-c", "local", "-m", "mift.cluster.mift_wheel_check", "-a", args],
        capture_output=True,
        text=True,
        env={
            **os.environ,
            # the collection mift.cluster as the checkout provides it (collections/)
            "ANSIBLE_COLLECTIONS_PATH": str(REPO / "collections"),
            "ANSIBLE_LOCALHOST_WARNING": "0",
            "ANSIBLE_INVENTORY_UNPARSED_WARNING": "0",
        },
        cwd=tmp_path,
        check=False,
        timeout=120,
    )
    status, _, payload = proc.stdout.partition(" => ")
    return "FAILED!" in status, json.loads(payload)


def test_a_missing_wheel_fails_once_naming_the_file_the_hosts_and_what_to_pin(
    tmp_path: Path, index: str
) -> None:
    failed, result = run_module(
        tmp_path, index, ["torch==2.11.0+rocm7.2"], {"host1": "cp311", "host2": "cp311"}
    )
    assert failed
    assert result["msg"] == (
        f"error: wheel check before any install: {index}/torch/ has no "
        "torch-2.11.0+rocm7.2-cp311-cp311-manylinux_*_x86_64.whl for host1, host2 (cp311); pin one that "
        "exists for cp311: 2.12.0+rocm7.2 (set pytorch_version / pytorch_torchaudio_version, or "
        "pytorch_index_url to a mirror that has them)"
    )
    print(result["msg"])


def test_present_wheels_pass(tmp_path: Path, index: str) -> None:
    failed, result = run_module(
        tmp_path, index, ["torch==2.12.0+rocm7.2"], {"host1": "cp311", "host2": "cp312"}
    )
    assert not failed
    assert result["missing"] == []
