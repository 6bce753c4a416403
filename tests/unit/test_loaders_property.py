"""Property: whatever bytes, YAML or JSON a config holds, the CLI answers with an exit code, not a traceback.

``validate`` exits 0 or 2 with one line per problem; ``run`` and ``plan`` exit 2 on a bad job spec with one
line, and ``run`` never constructs the ansible-runner wrapper (the test double
``RunnerMustNotBeCalled`` fails if
it does).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from launcher.backends import runner as runner_module
from launcher.main import cli
from mift_testsupport.cli import RunnerMustNotBeCalled

REPO = Path(__file__).resolve().parents[2]
SETTINGS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)

scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)
JOB_KEYS = ["name", "train_config", "deepspeed", "hosts", "nproc_per_node", "master_port", "env"]
# a job spec's keys with arbitrary values: reaches the model's checks, not only the parser
job_specs = st.dictionaries(st.sampled_from(JOB_KEYS), values, min_size=1, max_size=6)


@pytest.fixture(autouse=True)
def _no_runner(monkeypatch: pytest.MonkeyPatch) -> None:
    # the one seam where the launcher builds its runner (launcher.backends.runner.make_runner)
    monkeypatch.setattr(runner_module, "PlaybookRunner", RunnerMustNotBeCalled)


def _answer(capsys: pytest.CaptureFixture[str], argv: list[str], allowed: set[int]) -> str:
    rc = cli(argv)
    err = capsys.readouterr().err
    assert rc in allowed, err
    assert "Traceback" not in err
    return err


@SETTINGS
@given(data=st.binary(max_size=400), suffix=st.sampled_from([".yaml", ".json", ".yml", ""]))
def test_validate_any_bytes(tmp_path_factory, capsys, data: bytes, suffix: str) -> None:
    path = tmp_path_factory.mktemp("bytes") / f"config{suffix}"
    path.write_bytes(data)
    err = _answer(capsys, ["validate", "--builtin", str(path)], {0, 2})
    assert all(line.startswith(str(path)) for line in err.splitlines())


@SETTINGS
@given(doc=values, as_json=st.booleans())
def test_validate_any_yaml_or_json(tmp_path_factory, capsys, doc: object, as_json: bool) -> None:
    folder = tmp_path_factory.mktemp("docs")
    path = folder / ("config.json" if as_json else "config.yaml")
    path.write_text(json.dumps(doc) if as_json else yaml.safe_dump(doc))
    _answer(capsys, ["validate", "--builtin", str(path)], {0, 2})


@SETTINGS
@given(spec=job_specs)
def test_run_and_plan_refuse_generated_job_specs_in_one_line(tmp_path_factory, capsys, spec: dict) -> None:
    path = tmp_path_factory.mktemp("jobs") / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    for argv in (["run", str(path), "--detach"], ["plan", str(path)]):
        err = _answer(capsys, argv, {2})
        assert len(err.strip().splitlines()) == 1, err
