"""Unit tests of the Python helpers the stack roles ship to the nodes (ds_report parser, tree hash, build
driver, flash_attn's Triton probe)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

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


def test_build_puts_the_venv_bin_first_on_path_once() -> None:
    build_env = _load(REPO / "roles/wheel_cache/files/mift_build_wheel.py").build_env
    venv_bin = Path("/opt/mift/venv/bin")
    env = build_env({"PATH": "/usr/bin:/opt/mift/venv/bin:/bin", "MAX_JOBS": "8"}, venv_bin)
    assert env == {"PATH": "/opt/mift/venv/bin:/usr/bin:/bin", "MAX_JOBS": "8"}
    assert build_env({}, venv_bin)["PATH"].startswith("/opt/mift/venv/bin:")


def test_build_refuses_to_start_without_a_required_tool(tmp_path: Path) -> None:
    """A build that needs ninja stops before compiling anything, with one line naming the tool and why."""
    script = REPO / "roles/wheel_cache/files/mift_build_wheel.py"
    argv = [sys.executable, str(script), "--name", "flash-attn", "--key", "k" * 64]
    argv += ["--workdir", str(tmp_path), "--srcdir", str(tmp_path), "--host-log", str(tmp_path / "host.log")]
    argv += ["--build-json", '["false"]', "--require-tool=mift-no-such-tool"]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert done.returncode == 2
    assert done.stderr.startswith("flash-attn: mift-no-such-tool not found on the build PATH (")
    assert done.stderr.count("\n") == 1 and "install it into the venv before the build" in done.stderr
    assert not (tmp_path / "result.json").exists() and not (tmp_path / "host.log").exists()
    assert f"build PATH: {Path(sys.executable).parent}:" in (tmp_path / "build.log").read_text()


def _fake_dist(site: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> None:
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    lines = [f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"]
    lines += [f"Requires-Dist: {r}\n" for r in requires]
    (info / "METADATA").write_text("".join(lines))


@pytest.mark.parametrize(
    ("triton", "installed", "missing"),
    [
        ("triton-rocm==3.6.0", ("triton-rocm", "3.6.0"), []),  # newer ROCm wheels (torch 2.10.0+rocm7.1)
        ("pytorch-triton-rocm==3.4.0", ("pytorch-triton-rocm", "3.4.0"), []),  # older ROCm wheels
        ("triton-rocm==3.6.0", ("triton", "3.5.0"), ["triton-rocm"]),  # another Triton than torch's
    ],
)
def test_triton_probe_knows_every_rocm_triton_name(
    tmp_path: Path, triton: str, installed: tuple[str, str], missing: list[str]
) -> None:
    """The flash_attn Triton check reads the Triton torch requires under all its names."""
    role_vars = yaml.safe_load((REPO / "roles/flash_attn/vars/main.yml").read_text())
    _fake_dist(tmp_path, "torch", "2.10.0+rocm7.1", ("filelock", f'{triton}; platform_system == "Linux"'))
    _fake_dist(tmp_path, *installed)
    argv = [sys.executable, "-S", "-c", role_vars["_flash_attn_triton_probe_src"]]
    env = {"PYTHONPATH": str(tmp_path)}
    argv += role_vars["_flash_attn_triton_dists"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    probe = json.loads(done.stdout)
    assert probe["required"] == [f'{triton}; platform_system == "Linux"']
    assert probe["installed"] == {installed[0]: installed[1]}
    assert probe["missing"] == missing
