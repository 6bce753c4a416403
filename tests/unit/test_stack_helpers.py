"""Unit tests of the Python helpers the stack roles ship to the nodes (ds_report parser, tree hash)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]

# Captured from `ds_report` of DeepSpeed 0.19.8 on CPU (colour codes kept), abridged.
DS_REPORT = (
    "op name ................ installed .. compatible\n"
    "--------------------------------------------------\n"
    "deepspeed_not_implemented  \x1b[93m[NO]\x1b[0m ....... \x1b[92m[OKAY]\x1b[0m\n"
    "\x1b[93m [WARNING] \x1b[0m async_io: please install the libaio-dev package with apt\n"
    "async_io ............... \x1b[93m[NO]\x1b[0m ....... \x1b[93m[NO]\x1b[0m\n"
    "deepspeed_shm_comm ..... \x1b[92m[YES]\x1b[0m ...... \x1b[92m[OKAY]\x1b[0m\n"
    "cpu_adam ............... \x1b[92m[YES]\x1b[0m ...... \x1b[92m[OKAY]\x1b[0m\n"
    "fused_adam ............. \x1b[93m[NO]\x1b[0m ....... \x1b[92m[OKAY]\x1b[0m\n"
    "torch version .................... 2.13.0+cpu\n"
    "deepspeed info ................... 0.19.8, unknown, unknown\n"
)


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


def test_ds_report_parser_reads_ops_and_versions() -> None:
    parse = _load(REPO / "roles/deepspeed/files/mift_ds_report.py").parse
    result = parse(DS_REPORT)
    assert result["ops"]["cpu_adam"] == {"installed": True, "compatible": True}
    assert result["ops"]["deepspeed_shm_comm"]["installed"] is True
    assert result["ops"]["fused_adam"] == {"installed": False, "compatible": True}
    assert result["ops"]["async_io"] == {"installed": False, "compatible": False}
    assert result["ops"]["deepspeed_not_implemented"]["installed"] is False
    assert result["info"] == {"torch version": "2.13.0+cpu", "deepspeed info": "0.19.8, unknown, unknown"}


def test_tree_hash_follows_content_not_build_output(tmp_path: Path) -> None:
    tree_hash = _load(REPO / "roles/wheel_cache/files/mift_tree_hash.py").tree_hash
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.c").write_text("int a;\n")
    first = tree_hash(tmp_path)
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / "x.o").write_bytes(b"\0")
    (tmp_path / "pkg.egg-info").mkdir()
    (tmp_path / "pkg.egg-info" / "PKG-INFO").write_text("x")
    assert tree_hash(tmp_path) == first
    (tmp_path / "src" / "a.c").write_text("int a = 1;\n")
    assert tree_hash(tmp_path) != first


def test_fixture_tree_hash_is_stable() -> None:
    tree_hash = _load(REPO / "roles/wheel_cache/files/mift_tree_hash.py").tree_hash
    fixture = REPO / "tests/fixtures/buildonce_pkg"
    assert tree_hash(fixture) == tree_hash(fixture)
