"""Tokenize once: what the cache key covers, what makes a new tokenization, the controller's copy
checked before use, and whole passes on a loopback node whose tokenizer is a test double."""

from __future__ import annotations

import dataclasses
import io
import json
import sys
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from launcher.engine.plan import TRAIN_FILE, with_tokenized_path
from launcher.exceptions import JobFailedError
from launcher.node import prepare as mift_prepare
from launcher.node import stage as mift_stage
from launcher.transfer import nodecall, tokenize_once
from launcher.transfer.staging import stage
from launcher.transfer.tokenize_once import (
    DATA_KEYS,
    IGNORED_DATA_KEYS,
    cache_key,
    changes,
    key_inputs,
    skip_reason,
    tokenize_for_run,
    tokenizer_files,
)
from launcher.validation.job import load_job

TRAIN = {
    "stage": "sft",
    "do_train": True,
    "model_name_or_path": "/opt/m",
    "dataset_dir": "/opt/d",
    "dataset": "tiny_alpaca",
    "template": "default",
    "cutoff_len": 64,
    "learning_rate": 1.0e-3,
    "max_steps": 8,
    "output_dir": "output",
    "preprocessing_num_workers": 1,
}
MODEL = {
    "config.json": {"size": 2, "sha256": "c" * 64},
    "tokenizer.json": {"size": 3, "sha256": "t" * 64},
    "tokenizer_config.json": {"size": 3, "sha256": "u" * 64},
    "model.safetensors": {"size": 5000, "sha256": "w" * 64},
    "model-00001-of-00002.safetensors": {"size": 5000, "sha256": "x" * 64},
    "model.safetensors.index.json": {"size": 10, "sha256": "i" * 64},
}
DATA = {"dataset_info.json": {"size": 5, "sha256": "d" * 64}, "tiny.json": {"size": 9, "sha256": "e" * 64}}
VERSIONS = {"llamafactory": "0.9.5", "transformers": "5.6.0", "datasets": "4.0.0", "torch": "2.13.0+cpu"}


def _key(
    train: dict[str, Any] = TRAIN, model: Any = MODEL, data: Any = DATA, versions: Any = VERSIONS
) -> str:
    return cache_key(key_inputs(train, data, model, versions))


# --- the key ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("what", "train", "model", "data", "versions"),
    [
        ("cutoff_len", {**TRAIN, "cutoff_len": 32}, MODEL, DATA, VERSIONS),
        ("template", {**TRAIN, "template": "llama3"}, MODEL, DATA, VERSIONS),
        ("dataset", {**TRAIN, "dataset": "other"}, MODEL, DATA, VERSIONS),
        ("packing", {**TRAIN, "packing": True}, MODEL, DATA, VERSIONS),
        ("val_size and the split seed", {**TRAIN, "val_size": 0.1}, MODEL, DATA, VERSIONS),
        ("seed", {**TRAIN, "seed": 7}, MODEL, DATA, VERSIONS),
        ("stage", {**TRAIN, "stage": "pt"}, MODEL, DATA, VERSIONS),
        (
            "a tokenizer file",
            TRAIN,
            {**MODEL, "tokenizer.json": {"size": 3, "sha256": "T" * 64}},
            DATA,
            VERSIONS,
        ),
        (
            "a tokenizer file added",
            TRAIN,
            {**MODEL, "added_tokens.json": {"size": 1, "sha256": "a"}},
            DATA,
            VERSIONS,
        ),
        ("a dataset file", TRAIN, MODEL, {**DATA, "tiny.json": {"size": 9, "sha256": "E" * 64}}, VERSIONS),
        ("LLaMA-Factory's version", TRAIN, MODEL, DATA, {**VERSIONS, "llamafactory": "0.9.6"}),
        ("transformers' version", TRAIN, MODEL, DATA, {**VERSIONS, "transformers": "5.7.0"}),
    ],
)
def test_what_changes_the_result_changes_the_key(
    what: str, train: dict[str, Any], model: Any, data: Any, versions: Any
) -> None:
    assert _key(train, model, data, versions) != _key(), what


@pytest.mark.parametrize(
    ("what", "train", "model", "data", "versions"),
    [
        (
            "learning_rate, max_steps",
            {**TRAIN, "learning_rate": 5e-4, "max_steps": 100},
            MODEL,
            DATA,
            VERSIONS,
        ),
        ("output_dir", {**TRAIN, "output_dir": "/x"}, MODEL, DATA, VERSIONS),
        ("where the data is", {**TRAIN, "dataset_dir": "/mnt/elsewhere"}, MODEL, DATA, VERSIONS),
        ("where the model is", {**TRAIN, "model_name_or_path": "/mnt/m"}, MODEL, DATA, VERSIONS),
        ("how many workers", {**TRAIN, "preprocessing_num_workers": 16}, MODEL, DATA, VERSIONS),
        ("overwrite_cache", {**TRAIN, "overwrite_cache": False}, MODEL, DATA, VERSIONS),
        (
            "the weights (a fine-tuned checkpoint of the same tokenizer)",
            TRAIN,
            {**MODEL, "model.safetensors": {"size": 6000, "sha256": "W" * 64}},
            DATA,
            VERSIONS,
        ),
        ("torch's version", TRAIN, MODEL, DATA, {**VERSIONS, "torch": "2.14.0"}),
    ],
)
def test_what_does_not_change_the_result_keeps_the_key(
    what: str, train: dict[str, Any], model: Any, data: Any, versions: Any
) -> None:
    assert _key(train, model, data, versions) == _key(), what


def test_tokenizer_files_are_the_model_folder_but_its_weights() -> None:
    assert set(tokenizer_files(MODEL)) == {"config.json", "tokenizer.json", "tokenizer_config.json"}


def test_every_data_argument_of_llamafactory_is_classified() -> None:
    """A LLaMA-Factory upgrade that adds a data argument fails here until it is put in the key or ignored."""
    data_args = pytest.importorskip("llamafactory.hparams.data_args")
    fields = {f.name for f in dataclasses.fields(data_args.DataArguments)}
    assert fields == set(DATA_KEYS) | set(IGNORED_DATA_KEYS), fields ^ (
        set(DATA_KEYS) | set(IGNORED_DATA_KEYS)
    )
    assert not set(DATA_KEYS) & set(IGNORED_DATA_KEYS)


def test_what_changed_is_said_in_one_phrase_each() -> None:
    old = key_inputs(TRAIN, DATA, MODEL, VERSIONS)
    new = key_inputs(
        {**TRAIN, "cutoff_len": 32}, DATA, {**MODEL, "tokenizer.json": {"sha256": "T"}}, VERSIONS
    )
    assert changes(old, new) == ["model file tokenizer.json changed", "cutoff_len 64 -> 32"]
    assert changes(old, old) == []


@pytest.mark.parametrize(
    ("stage_keys", "train", "enabled", "why"),
    [
        (["model", "dataset_dir"], TRAIN, True, None),
        (["model", "dataset_dir"], TRAIN, False, "stage.tokenize_once is false"),
        (["model"], TRAIN, True, "does not stage both its model and its dataset_dir"),
        (["dataset_dir"], TRAIN, True, "does not stage both its model and its dataset_dir"),
        (["model", "dataset_dir"], {**TRAIN, "tokenized_path": "/t"}, True, "sets tokenized_path (/t)"),
        (["model", "dataset_dir"], {**TRAIN, "streaming": True}, True, "streams its dataset"),
    ],
)
def test_which_jobs_tokenize_once(
    stage_keys: list[str], train: dict[str, Any], enabled: bool, why: Any
) -> None:
    got = skip_reason(stage_keys, train, enabled)
    assert got is None if why is None else why in str(got)


# --- the node program's protocol (no LLaMA-Factory needed) ---------------------------------------------
def test_a_node_that_holds_the_key_answers_without_tokenizing(tmp_path: Path) -> None:
    dest = tmp_path / "tok" / "k"
    (dest / "train").mkdir(parents=True)
    (dest / "dataset_dict.json").write_text("{}")
    (dest / "train" / "data.arrow").write_bytes(b"arrow")
    mift_prepare.manifest_file(dest).write_text(json.dumps(mift_prepare.manifest(dest)))  # as published
    request = {"env": {"NNODES": "2", "X": "1"}, "args": {}, "dest": str(dest), "stage": "sft"}
    answer = nodecall.call([], sys.executable, "tokenize", request, log=tmp_path / "log", timeout_s=60)
    assert answer["ok"] and answer["tokenized"] is False
    assert answer["files"] == mift_prepare.manifest(dest) and set(answer["files"]) == {
        "dataset_dict.json",
        "train/data.arrow",
    }


def test_a_node_folder_is_fetched_whole(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "a" / "b").mkdir(parents=True)
    (src / "a" / "b" / "x.bin").write_bytes(b"x" * 3000)
    (src / "top.json").write_text("{}")
    nodecall.fetch_folder([], str(src), tmp_path / "copy", timeout_s=60)
    assert mift_prepare.manifest(tmp_path / "copy") == mift_prepare.manifest(src)


# --- whole passes on a loopback node, its tokenizer a test double ---------------------------------------
class StageRunnerDouble:
    """TEST DOUBLE of PlaybookRunner for playbooks/stage.yml: this machine's report (connection local)."""

    def __init__(self, node_cache: Path) -> None:
        self.cancel_requested = threading.Event()
        self.node_cache = node_cache

    def run(self, playbook: str, extravars: dict[str, Any]) -> Any:
        from launcher.backends.runner import PlaybookResult  # noqa: PLC0415

        held = mift_stage.report(list(extravars["mift_stage_dests"]), mift_stage.HashCache(self.node_cache))
        answer = {"held": held, "connection": "local", "ssh": {"host": "host1"}, "play_hosts": ["host1"]}
        return PlaybookResult(playbook, 0, "successful", reports={"host1": {"stage": answer}})


class TokenizerTestDouble:
    """TEST DOUBLE of the node's LLaMA-Factory pipeline under the real node program's ``tokenize``: writes a
    folder whose content follows the request's cutoff_len, and counts the passes."""

    def __init__(self) -> None:
        self.passes: list[dict[str, Any]] = []

    def pipeline(self, args: dict[str, Any], stage: str) -> None:
        assert stage == "sft" and "deepspeed" not in args
        self.passes.append(args)
        part = Path(args["tokenized_path"])
        (part / "train").mkdir(parents=True)
        (part / "dataset_dict.json").write_text('{"splits": ["train"]}')
        (part / "train" / "data.arrow").write_text(f"cutoff {args['cutoff_len']}")

    def __call__(
        self, ssh: list[str], python: str, verb: str, request: dict[str, Any], **_: Any
    ) -> dict[str, Any]:
        assert verb == "tokenize" and ssh == [] and python.endswith("/venv/bin/python3")
        return mift_prepare.tokenize(request, self.pipeline)


@pytest.fixture
def loopback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    monkeypatch.setenv("MIFT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("MIFT_TOKENIZED_DIR", str(tmp_path / "controller-tokenized"))
    monkeypatch.setattr(tokenize_once, "TOKENIZED_ROOT", str(tmp_path / "node" / "tokenized"))
    double = TokenizerTestDouble()
    monkeypatch.setattr(nodecall, "call", double)
    for folder, files in (
        ("m", {"config.json": "{}", "tokenizer.json": "tok", "model.safetensors": "w" * 99}),
        ("d", {"dataset_info.json": "{}", "tiny.json": "[]"}),
    ):
        for rel, text in files.items():
            (tmp_path / folder).mkdir(exist_ok=True)
            (tmp_path / folder / rel).write_text(text)
    return SimpleNamespace(tmp=tmp_path, double=double)


def _pass(lb: SimpleNamespace, **train_updates: Any) -> tuple[Any, str]:
    tmp = lb.tmp
    train = {
        **TRAIN,
        "model_name_or_path": str(tmp / "node" / "m"),
        "dataset_dir": str(tmp / "node" / "d"),
        **train_updates,
    }
    (tmp / "train.yaml").write_text(yaml.safe_dump(train))
    spec = {
        "name": "tk",
        "train_config": "train.yaml",
        "hosts": ["host1"],
        "stage": {
            "model": {"controller": "m"},
            "dataset_dir": {"controller": "d"},
            "node_cache": str(tmp / "nc.json"),
        },
    }
    (tmp / "job.yaml").write_text(yaml.safe_dump(spec))
    job = load_job(tmp / "job.yaml")
    runner: Any = StageRunnerDouble(tmp / "nc.json")
    out = io.StringIO()
    outcome = stage(job, runner, out=out)
    assert outcome is not None
    plan: Any = SimpleNamespace(
        spec=job.spec,
        hosts=["host1"],
        facts=SimpleNamespace(stack={"host1": {"versions": VERSIONS}}),
        jobs={"host1": {"argv": ["/venv/bin/llamafactory-cli", "train", "train.yaml"]}},
        envs={"host1": {}},
        run_id="tk-1",
    )
    done = tokenize_for_run(
        plan, runner, outcome, tmp / "run" / "tokenize", train=train, out=out, stop=threading.Event()
    )
    return done, out.getvalue()


def test_tokenized_once_then_read_from_the_copy_then_again_after_a_change(loopback: SimpleNamespace) -> None:
    done, text = _pass(loopback)
    assert done is not None and len(loopback.double.passes) == 1, text
    path, record = done
    assert record["tokenized"] and "no tokenized copy here yet" in text
    assert Path(path, "train", "data.arrow").read_text() == "cutoff 64"
    assert path == f"{loopback.tmp}/node/tokenized/{record['key']}"
    # same inputs: the controller's copy; nothing tokenized, nothing sent (the node holds it)
    again, text = _pass(loopback, learning_rate=5e-4)
    assert again is not None and again[0] == path and len(loopback.double.passes) == 1, text
    assert not again[1]["tokenized"] and "held here (tokenized by tk-1 on host1)" in text
    # cutoff changed: a new key, tokenized again, once; the first copy is still there, untouched
    other, text = _pass(loopback, cutoff_len=32)
    assert other is not None and other[0] != path and len(loopback.double.passes) == 2, text
    assert "is new (cutoff_len 64 -> 32)" in text
    assert Path(other[0], "train", "data.arrow").read_text() == "cutoff 32"
    assert Path(path, "train", "data.arrow").read_text() == "cutoff 64"
    # the tokenizer changed: again
    (loopback.tmp / "m" / "tokenizer.json").write_text("tok2")
    changed, text = _pass(loopback, cutoff_len=32)
    assert (
        changed is not None
        and len(loopback.double.passes) == 3
        and "model file tokenizer.json changed" in text
    )


def test_a_corrupt_controller_copy_is_never_used(loopback: SimpleNamespace) -> None:
    done, _ = _pass(loopback)
    assert done is not None
    key = done[1]["key"]
    copy = loopback.tmp / "controller-tokenized" / key / "train" / "data.arrow"
    copy.write_text("cutoff 99")  # changed after it was checked
    node_copy = Path(done[0], "train", "data.arrow")
    node_copy.unlink()
    again, text = _pass(loopback)
    assert again is not None and len(loopback.double.passes) == 2, text
    assert f"key {key[:12]} is new (its copy here no longer matches its record)" in text
    assert copy.read_text() == "cutoff 64" and node_copy.read_text() == "cutoff 64"


def test_a_copy_that_arrives_different_is_refused(
    loopback: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = nodecall.fetch_folder

    def corrupting(ssh: list[str], folder: str, into: Path, timeout_s: float) -> None:
        real(ssh, folder, into, timeout_s)
        (into / "dataset_dict.json").write_text("{}")

    monkeypatch.setattr(nodecall, "fetch_folder", corrupting)
    with pytest.raises(
        JobFailedError, match=r"the tokenized copy did not arrive intact: dataset_dict\.json: sha256"
    ):
        _pass(loopback)
    assert not list((loopback.tmp / "controller-tokenized").glob("*.json"))


def test_the_shipped_yaml_reads_the_tokenized_copy() -> None:
    @dataclasses.dataclass(frozen=True)
    class PlanLike:
        files: Any

    plan: Any = PlanLike({TRAIN_FILE: yaml.safe_dump(TRAIN).encode(), "ds_config.json": b"{}"})
    shipped = with_tokenized_path(plan, "/var/lib/mift/tokenized/k").files
    assert yaml.safe_load(shipped[TRAIN_FILE]) == {**TRAIN, "tokenized_path": "/var/lib/mift/tokenized/k"}
    assert shipped["ds_config.json"] == b"{}"


def test_the_record_keeps_the_key_inputs(loopback: SimpleNamespace) -> None:
    done, _ = _pass(loopback)
    assert done is not None
    record = done[1]
    kept = json.loads((loopback.tmp / "controller-tokenized" / f"{record['key']}.json").read_text())
    assert kept["inputs"] == record["inputs"] and record["inputs"]["train"]["cutoff_len"] == 64
    assert record["digest"] == kept["digest"] and record["files"] == 2
