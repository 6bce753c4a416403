"""Models from the hub (launcher/hub.py) against the stand-in hub (mift_testsupport.hub_testdouble, TEST
DOUBLE) on 127.0.0.1, with the real huggingface_hub client.

Each failure is run as a user runs it (``python -m launcher run JOB -i INVENTORY``, a subprocess) and must be
one line, before any host is asked, with nothing left under the controller's hub folder and no run directory;
the time from the command to its line is printed (``pytest -s``).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import huggingface_hub
import pytest
from huggingface_hub import constants

from launcher.exceptions import ConfigurationError, JobFailedError
from launcher.spec.jobspec import StageSource
from launcher.transfer import hub
from launcher.transfer.manifest import StageItem, build_manifest, controller_cache
from mift_testsupport.hub_testdouble import HubState, Repo, serving
from mift_testsupport.paths import REPO_ROOT

if TYPE_CHECKING:
    from collections.abc import Iterator

    from mift_testsupport.hub_testdouble import _Server

GATED = "meta-llama/Meta-Llama-3-70B-Instruct"
TOKEN = "hf_unitGRANTED" + "0123456789abcdef"  # the one token the stand-in grants the gated repo
JOB = REPO_ROOT / "configs" / "jobs" / "llama3-70b-lora-z3.yaml"
INVENTORY = REPO_ROOT / "inventory" / "example" / "hosts.yml"


def tiny_repo_folder(root: Path) -> Path:
    """A model folder as small as a test wants (a config, a tokenizer file, weights bytes)."""
    folder = root / "tiny"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 8}))
    (folder / "tokenizer_config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(os.urandom(4096))
    return folder


@pytest.fixture
def stand_in(tmp_path: Path) -> Iterator[tuple[_Server, HubState, Path]]:
    state = HubState()
    folder = tiny_repo_folder(tmp_path)
    state.add(Repo.from_folder(GATED, folder, gated=True, granted={TOKEN}))
    state.tokens.add("hf_knownButNotGranted000")
    with serving(state) as server:
        yield server, state, folder


@pytest.fixture(autouse=True)
def _controller(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A controller of its own: caches, runs, no token file, no token in the environment."""
    monkeypatch.setenv("MIFT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("MIFT_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_TOKEN_PATH", str(tmp_path / "hf-home" / "token"))
    # read at its import: the in-process client's token file
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "hf-home" / "token"))
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    hub._FETCHED.clear()


def launcher_run(
    tmp_path: Path, endpoint: str, *, token: str | None, job: Path = JOB
) -> tuple[int, str, float]:
    # the shipped key lists (no torch import): the launcher's validation as the unit suite runs it
    env = {
        **os.environ,
        "HF_ENDPOINT": endpoint,
        "PYTHONPATH": str(REPO_ROOT / "python"),
        "MIFT_VALIDATE_BUILTIN": "1",
    }
    env.pop("HF_TOKEN", None)
    if token is not None:
        env["HF_TOKEN"] = token
    t0 = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "launcher", "run", "-i", str(INVENTORY), str(job)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    return done.returncode, (done.stdout + done.stderr).strip(), time.monotonic() - t0


def revision_job(tmp_path: Path, revision: str) -> Path:
    """The shipped 70B job with another ``stage.model.revision``, beside it so its relative paths hold."""
    text = JOB.read_text().replace("    revision: main", f"    revision: {revision}")
    assert f"revision: {revision}" in text
    path = JOB.with_name(f".{tmp_path.name}-revision.yaml")
    path.write_text(text)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


CASES = {
    "gated-no-token": (None, "is gated on the hub and the controller has no token", 2),
    "wrong-token": (
        "hf_notAValidToken999",
        "the hub refused the token from HF_TOKEN (invalid credentials)",
        2,
    ),
    "gated-not-granted": ("hf_knownButNotGranted000", "the token from HF_TOKEN has no access to it", 2),
    "unknown-revision": (TOKEN, "no revision 'v9-nonexistent' on the hub", 2),
    "hub-unreachable": (TOKEN, "hub unreachable at http://127.0.0.1:", 1),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_hub_failure_is_one_line_before_any_host(
    case: str, stand_in: tuple[_Server, HubState, Path], tmp_path: Path
) -> None:
    server, _state, _folder = stand_in
    token, expected, code = CASES[case]
    endpoint = f"http://127.0.0.1:{free_port()}" if case == "hub-unreachable" else server.url
    job = revision_job(tmp_path, "v9-nonexistent") if case == "unknown-revision" else JOB
    try:
        rc, output, took = launcher_run(tmp_path, endpoint, token=token, job=job)
    finally:
        if job != JOB:
            job.unlink()
    print(f"\n{case}: {took:.2f} s from the command to: {output}")
    assert rc == code, output
    assert len(output.splitlines()) == 1, output
    assert expected in output
    assert "stage.model.hub" in output
    hub_dir = tmp_path / "cache" / "hub"
    left = (
        sorted(str(p.relative_to(hub_dir)) for p in hub_dir.rglob("*") if p.is_file())
        if hub_dir.exists()
        else []
    )
    assert left == [], left  # nothing half-written
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
    if token:
        assert token not in output


def test_unknown_repo_is_one_line(stand_in: tuple[_Server, HubState, Path], tmp_path: Path) -> None:
    server, _state, _folder = stand_in
    text = JOB.read_text().replace(f"hub: {GATED}", "hub: meta-llama/No-Such-Model")
    job = JOB.with_name(f".{tmp_path.name}-unknown.yaml")
    job.write_text(text)
    try:
        rc, output, took = launcher_run(tmp_path, server.url, token=TOKEN, job=job)
    finally:
        job.unlink()
    print(f"\nunknown-id: {took:.2f} s from the command to: {output}")
    assert rc == 2, output
    assert len(output.splitlines()) == 1, output
    assert "meta-llama/No-Such-Model: no such repo on the hub the token from HF_TOKEN sees" in output


def test_fetched_once_resolved_recorded_and_no_token_anywhere(
    stand_in: tuple[_Server, HubState, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server, state, folder = stand_in
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    (tmp_path / "hf-home").mkdir()
    (tmp_path / "hf-home" / "token").write_text(TOKEN + "\n")  # the token file `hf auth login` writes
    source = StageSource(hub=GATED)
    said: list[str] = []
    snap = hub.fetch(JOB, "model", source, say=said.append)
    repo_commit = state.repos[("model", GATED)].commit
    assert snap.commit == repo_commit and snap.path.name == repo_commit
    assert sorted(p.name for p in snap.path.iterdir()) == sorted(p.name for p in folder.iterdir())
    assert (snap.path / "model.safetensors").read_bytes() == (folder / "model.safetensors").read_bytes()
    assert "fetched in" in said[0], said
    assert f"the token file {tmp_path / 'hf-home' / 'token'}" == hub.token_and_source()[1]
    # a second job asks the hub for the commit only: no file is downloaded again
    before = len(state.requests)
    again = hub.fetch(JOB, "model", source, say=said.append)
    assert again.path == snap.path
    assert [r for r in state.requests[before:] if "/resolve/" in r[1] or "/lfs-objects/" in r[1]] == []
    assert "not fetched again" in said[1]
    # the staged folder's record names the hub, the revision and its commit
    item = StageItem("model", "hub", str(snap.path), "/opt/mift/models/Meta-Llama-3-70B-Instruct")
    record = build_manifest(item, controller_cache()).record()
    assert record["hub"] == {
        "repo": GATED,
        "repo_type": "model",
        "revision": "main",
        "commit": repo_commit,
        "endpoint": server.url,
    }
    # the weights bytes came from the CDN path without a token; the hub's API with it
    assert any("/lfs-objects/" in r[1] and not r[2] for r in state.requests)
    grep = subprocess.run(
        ["grep", "-rlF", TOKEN, str(tmp_path / "cache")], capture_output=True, text=True, check=False
    )
    print(f"\n$ grep -rlF <token> {tmp_path / 'cache'} -> exit {grep.returncode}, {grep.stdout!r}")
    assert grep.returncode == 1, grep.stdout  # 1: no file holds it
    assert not any(TOKEN in line for line in said)


def test_interrupted_fetch_leaves_nothing_under_a_final_name(
    stand_in: tuple[_Server, HubState, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server, _state, _folder = stand_in
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("HF_TOKEN", TOKEN)

    def cut(*_a: object, **kw: object) -> str:
        Path(str(kw["local_dir"]), "config.json").write_text("{half")
        raise KeyboardInterrupt

    monkeypatch.setattr(huggingface_hub, "snapshot_download", cut)
    with pytest.raises(KeyboardInterrupt):
        hub.fetch(JOB, "model", StageSource(hub=GATED))
    assert list(hub.repo_folder(GATED, "model").iterdir()) == []


def test_dataset_repo_needs_dataset_info(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = HubState()
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.json").write_text("[]")
    state.add(Repo.from_folder("me/my-data", data, "dataset"))
    with serving(state) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        with pytest.raises(ConfigurationError, match=r"no dataset_info\.json at the repo's top"):
            hub.fetch(JOB, "dataset_dir", StageSource(hub="me/my-data"))
        (data / "dataset_info.json").write_text('{"mine": {"file_name": "train.json"}}')
        state.add(Repo.from_folder("me/my-data", data, "dataset"))
        snap = hub.fetch(JOB, "dataset_dir", StageSource(hub="me/my-data"))
    assert (snap.path / "dataset_info.json").is_file() and snap.repo_type == "dataset"
    assert [p.name for p in hub.repo_folder("me/my-data", "dataset").iterdir() if p.is_dir()] == [snap.commit]


def test_unreachable_is_a_failure_not_bad_input(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")
    with pytest.raises(JobFailedError, match=r"hub unreachable at http://127\.0\.0\.1:"):
        hub.fetch(JOB, "model", StageSource(hub=GATED))


def test_no_playbook_environment_carries_the_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ansible-runner writes the launcher's whole environment into artifacts/<n>/command in the run directory
    (the first rehearsal found the token there): a runner drops the token variables first."""
    from launcher.backends.runner import PlaybookRunner  # noqa: PLC0415 - ansible_runner only here

    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setenv("HUGGING_FACE_HUB_TOKEN", TOKEN)
    PlaybookRunner(tmp_path / "pdd")
    assert "HF_TOKEN" not in os.environ
    assert "HUGGING_FACE_HUB_TOKEN" not in os.environ
