"""The probe (``plan --probe``): which candidates it runs, how it measures, how it picks, and its wiring.

The GPU runs are replaced by :class:`FakeGpuProber`, a test double that stands in for training on a GPU (this
machine has none): it answers each candidate with a scripted tokens/s. The real runner
(:class:`launcher.engine.probe.LauncherProber`) is tested here up to the files it writes (validated by the
engine's own loader and validator); it ran on the H200 (docs/gpu-results.md).
"""

from __future__ import annotations

import io
import json
import stat
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pytest
import yaml
from test_plan_wiring import _h200, _job

from launcher.engine.load import validate
from launcher.engine.plan import TRAIN_FILE, build_plan
from launcher.engine.probe import LauncherProber
from launcher.engine.split import auto_plan, record_of, summary_line
from launcher.exceptions import ConfigurationError
from launcher.planning.calibration import H200_CLUSTER, SHAPE_3B, SHAPE_8B
from launcher.planning.candidate import Candidate, ProbeMeasure
from launcher.planning.hardware import H200, MI300X
from launcher.planning.memory import Cluster, Strategy, Workload
from launcher.planning.model import BUNDLED_DIR, load_shape
from launcher.planning.probe import (
    job_tokens_per_s,
    probe_shortlist,
    run_probe,
    steady_tokens_per_s,
)
from launcher.planning.report import render_training
from launcher.planning.training import TrainingPlan, plan_training
from launcher.spec.jobspec_load import load_job_spec_bytes
from launcher.validation.job import load_job

if TYPE_CHECKING:
    from pathlib import Path

LLAMA3_70B = load_shape(BUNDLED_DIR / "llama3_70b.json")


def _bench_plan(shape: object = SHAPE_3B) -> TrainingPlan:
    w = Workload(shape, "lora", micro_batch=2, cutoff_len=1024, gradient_checkpointing=True)  # type: ignore[arg-type]
    return plan_training(w, H200_CLUSTER, accumulation=8, accelerator=H200)


@dataclass
class FakeGpuProber:
    """Test double for a GPU training run: answers ``rates[strategy]`` x the prediction, in ``cost_s``."""

    rates: dict[Strategy, float]
    cost_s: float = 30.0
    now: list[float] = field(default_factory=lambda: [0.0])
    calls: list[tuple[Candidate, int, float]] = field(default_factory=list)
    fail: set[Strategy] = field(default_factory=set)

    def clock(self) -> float:
        return self.now[0]

    def __call__(self, candidate: Candidate, steps: int, timeout_s: float) -> ProbeMeasure:
        self.calls.append((candidate, steps, timeout_s))
        self.now[0] += self.cost_s
        if candidate.strategy in self.fail:
            return ProbeMeasure(candidate, "failed", wall_s=self.cost_s, note="out of memory")
        rate = candidate.tokens_per_s * self.rates.get(candidate.strategy, 1.0)
        return ProbeMeasure(candidate, "measured", node_tokens_per_s=rate, wall_s=self.cost_s)


def test_steady_rate_leaves_the_first_step_out():
    # LLaMA-Factory's throughput is tokens since training began / seconds since then: step 1 took 10 s
    # (warm-up), the next three 2 s each for 16,384 tokens
    log = [{"current_steps": 1, "throughput": 1638.4, "total_tokens": 16384, "loss": 6.2}]
    for step in (2, 3, 4):
        seconds = 10 + 2 * (step - 1)
        log.append(
            {"current_steps": step, "throughput": 16384 * step / seconds, "total_tokens": 16384 * step}
        )
    rate, steps = steady_tokens_per_s(log)  # type: ignore[misc]
    assert steps == 3
    assert rate == pytest.approx(8192.0)
    # without include_num_input_tokens_seen there is no throughput: no measurement, never a guess
    assert steady_tokens_per_s([{"current_steps": 1, "loss": 1.0}, {"current_steps": 2, "loss": 0.9}]) is None
    assert steady_tokens_per_s(log[:1]) is None


def test_the_shortlist_spans_strategies_the_model_may_misrank():
    # the model ranks splits within a strategy well and strategies badly (3B ZeRO-2 micro-batch 16 measured
    # 1.84x its first prediction): after its choice the probe runs the best split of each other strategy
    # predicted within OTHER_STRATEGY_SHARE, before more splits of the same strategy
    w = Workload(LLAMA3_70B, "full", micro_batch=1, cutoff_len=2048, lora_dropout=0.05, attention="fa2")
    plan = plan_training(w, Cluster(2, 8, 191.98, 1536), accumulation=8, accelerator=MI300X)
    top = plan.shortlist(3)
    assert [c.strategy for c in top] == [Strategy.ZERO3, Strategy.ZERO3, Strategy.ZERO3_OFFLOAD_OPT]
    probed = probe_shortlist(plan, 3)
    assert probed[0] is plan.predicted_choice
    assert [c.strategy for c in probed] == [
        Strategy.ZERO3,
        Strategy.ZERO3_OFFLOAD_OPT,
        Strategy.ZERO3_OFFLOAD_ALL,
    ]
    assert all(c.fits and c.split == probed[0].split for c in probed)
    # the 3B bench shape on the H200: ZeRO-2 and DDP at micro-batch 16; ZeRO-3 (a third of it) is not probed
    bench = probe_shortlist(_bench_plan(), 2)
    assert [(c.strategy, c.split.micro_batch, c.split.checkpointing) for c in bench] == [
        (Strategy.ZERO2, 16, False),
        (Strategy.NONE, 16, False),
    ]
    assert all(c.strategy is not Strategy.ZERO3 for c in probe_shortlist(_bench_plan(), 3))


def test_the_probe_picks_by_measurement_and_the_plan_applies_the_pick():
    plan = _bench_plan()
    assert plan.choice is not None and plan.choice.strategy is Strategy.ZERO2  # the model's choice
    fake = FakeGpuProber({Strategy.NONE: 1.3})  # DDP measures 1.3x its prediction, ZeRO-2 as predicted
    probed = run_probe(plan, fake, count=3, steps=4, clock=fake.clock)
    assert len(fake.calls) == 3
    assert all(steps == 4 for _, steps, _ in fake.calls)
    assert probed.choice is not None
    assert probed.choice.strategy is Strategy.NONE
    assert probed.predicted_choice is plan.choice  # the model's own pick is still there
    assert probed.yaml_overrides()["per_device_train_batch_size"] == 16
    assert probed.deepspeed_config() is None
    text = render_training(probed)
    assert "Probe (4 steps each" in text
    assert "<- pick" in text
    assert "Picked by measurement: no DeepSpeed (DDP), micro-batch 16" in probed.reason()
    data = probed.as_json()
    assert data["choice"] == "none"
    assert [r["status"] for r in data["probe"]["runs"]] == ["measured"] * 3
    assert data["probe"]["pick"]["strategy"] == "none"


def test_a_failed_candidate_is_never_picked_and_nothing_measured_keeps_the_models_choice():
    plan = _bench_plan()
    fake = FakeGpuProber({Strategy.ZERO2: 5.0}, fail={Strategy.ZERO2})
    probed = run_probe(plan, fake, clock=fake.clock)
    # the model's choice (ZeRO-2) failed: the measured DDP candidate is picked, whatever ZeRO-2 promised
    assert probed.choice is not None and probed.choice.strategy is Strategy.NONE
    assert (
        "ZeRO-2, micro-batch 16 x accumulation 1, checkpointing off: failed (out of memory)"
        in probed.reason()
    )
    everything_fails = FakeGpuProber({}, fail={Strategy.NONE, Strategy.ZERO2})
    probed = run_probe(plan, everything_fails, clock=everything_fails.clock)
    assert probed.choice is plan.choice
    assert "Nothing was measured: the model's choice stands" in probed.reason()


def test_the_budget_bounds_the_probe_and_each_run_gets_what_is_left():
    plan = _bench_plan(SHAPE_8B)
    fake = FakeGpuProber({}, cost_s=70.0)
    probed = run_probe(plan, fake, count=3, budget_s=120.0, clock=fake.clock)
    assert [t for _, _, t in fake.calls] == [120.0, 50.0]
    assert probed.probe is not None
    assert [m.status for m in probed.probe.measures] == ["measured", "measured", "skipped"]
    # with less than MIN_RUN_S left, the next candidate is not started (a trainer start takes longer)
    fake = FakeGpuProber({}, cost_s=100.0)
    probed = run_probe(plan, fake, count=3, budget_s=120.0, clock=fake.clock)
    assert [t for _, _, t in fake.calls] == [120.0]
    assert probed.probe is not None
    assert [m.status for m in probed.probe.measures] == ["measured", "skipped", "skipped"]
    # with less than MIN_RUN_S left, the next candidate is not started (a trainer start takes longer)
    fake = FakeGpuProber({}, cost_s=100.0)
    probed = run_probe(plan, fake, count=3, budget_s=120.0, clock=fake.clock)
    assert [t for _, _, t in fake.calls] == [120.0]
    assert probed.probe is not None
    assert [m.status for m in probed.probe.measures] == ["measured", "skipped", "skipped"]
    assert "skipped (probe budget of 120 s spent)" in probed.reason()


def test_inter_node_communication_comes_from_the_model():
    # on one node the measurement is the job's rate; on 2 nodes the model's inter-node time is added
    one = _bench_plan()
    c = one.predicted_choice
    assert c is not None
    assert job_tokens_per_s(one, c, 10000.0) == pytest.approx(10000.0)
    # 2 nodes of 1 GPU: every ZeRO-3 gather crosses the NIC, which one node cannot see
    w = Workload(SHAPE_8B, "lora", micro_batch=2, cutoff_len=1024, gradient_checkpointing=True)
    two = plan_training(w, Cluster(2, 1, 191.98, 1536), accumulation=8, accelerator=MI300X)
    z3 = next(x for x in two.candidates if x.strategy is Strategy.ZERO3 and x.fits)
    node_rate = z3.step.tokens / 10.0  # the node measured one step in 10 s
    inter = z3.step.communication  # the model's gathers and reduce-scatters, all over the NIC here
    assert inter > 0
    assert job_tokens_per_s(two, z3, node_rate) == pytest.approx(
        2 * z3.step.tokens / (10.0 + inter), rel=0.01
    )
    ddp = next(x for x in two.candidates if x.strategy is Strategy.NONE and x.fits)
    ddp_rate = job_tokens_per_s(two, ddp, ddp.step.tokens / 10.0)
    assert ddp_rate < 2 * ddp.step.tokens / 10.0  # DDP's one all-reduce per step: small but counted


def _no_run(spec_path: Path, **_: object) -> int:
    raise AssertionError(f"{spec_path}: this test runs nothing")


def test_the_launcher_prober_writes_a_valid_one_node_job_for_each_candidate(tmp_path: Path):
    job = load_job(_job(tmp_path, "deepspeed: auto\nplan: probe\nenv: {A: '1'}\n", eval_strategy="steps"))
    plan = auto_plan(job, dict(job.train.data), _h200())
    prober = LauncherProber(job, "n1", None, tmp_path / "probe", out=None, run_job=_no_run)  # type: ignore[arg-type]
    candidates = probe_shortlist(plan)
    zero2 = next(c for c in candidates if c.strategy is Strategy.ZERO2)
    path = prober.prepare(zero2, 4, 95.2)
    written = load_job(path)
    validate(written)  # the engine's own validation of the spec, the YAML and the DeepSpeed JSON
    spec = written.spec
    assert (spec.hosts, spec.plan, spec.name) == (["n1"], "as_written", "j-probe1")
    assert spec.timeouts.job_s == 96
    assert dict(spec.env) == {"A": "1"}
    train = dict(written.train.data)
    assert (train["per_device_train_batch_size"], train["gradient_accumulation_steps"]) == (16, 1)
    assert train["disable_gradient_checkpointing"] is True
    assert (train["max_steps"], train["logging_steps"], train["include_num_input_tokens_seen"]) == (
        4,
        1,
        True,
    )
    assert train["save_strategy"] == "no" and train["eval_strategy"] == "no"
    assert train["overwrite_cache"] is False  # the later candidates reuse the first one's tokenized data
    assert (
        written.deepspeed is not None
        and json.loads((path.parent / "ds.json").read_text())["zero_optimization"]
    )
    ddp = prober.prepare(next(c for c in candidates if c.strategy is Strategy.NONE), 4, 50)
    assert load_job(ddp).deepspeed is None
    assert yaml.safe_load(ddp.read_text())["deepspeed"] == "none"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # it carries the job's env: secrets


def test_the_probe_job_spec_with_the_env_is_gone_after_its_run(tmp_path: Path):
    """The spec holds the job's env (HF_TOKEN...): removed once the probe ran, also when the run failed."""
    job = load_job(_job(tmp_path, "deepspeed: auto\nplan: probe\nenv: {HF_TOKEN: hf_secret}\n"))
    plan = auto_plan(job, dict(job.train.data), _h200())
    seen: list[str] = []

    def run_job_fails(spec_path: Path, **_: object) -> int:
        seen.append(spec_path.read_text())
        raise ConfigurationError("n1: unreachable")

    prober = LauncherProber(job, "n1", None, tmp_path / "probe", out=io.StringIO(), run_job=run_job_fails)
    measure = prober(probe_shortlist(plan)[0], 4, 60)
    assert measure.status == "failed" and "unreachable" in measure.note
    assert "hf_secret" in seen[0]  # the run got the env
    leftover = [p for p in (tmp_path / "probe").rglob("*") if p.is_file() and b"hf_secret" in p.read_bytes()]
    assert leftover == []


def test_plan_probe_in_the_job_spec_ships_the_probed_pick(tmp_path: Path):
    assert (
        load_job_spec_bytes(b"name: j\ntrain_config: t.yaml\nplan: probe\n", tmp_path / "j.yaml").plan
        == "probe"
    )
    job = load_job(_job(tmp_path, "deepspeed: auto\nplan: probe\n"))
    plan = auto_plan(job, dict(job.train.data), _h200())
    fake = FakeGpuProber({Strategy.NONE: 2.0})  # DDP measures twice its prediction: it beats ZeRO-2
    probed = run_probe(plan, fake, clock=fake.clock)
    run = build_plan(job, _h200(), "r1", training=probed)
    shipped = yaml.safe_load(run.files[TRAIN_FILE])
    assert run.deepspeed_name == "none"
    assert "deepspeed" not in shipped
    assert (shipped["per_device_train_batch_size"], shipped["gradient_accumulation_steps"]) == (16, 1)
    record = record_of(run.training)
    assert record["mode"] == "probe"
    assert record["probe"]["pick"]["strategy"] == "none"
    assert summary_line(probed).startswith("plan: probe (")


def test_plan_command_probe_prints_the_probe_and_json_carries_it(tmp_path: Path, capsys, monkeypatch):
    from test_plan_wiring import _cli  # noqa: PLC0415

    from launcher.engine import probe as engine_probe  # noqa: PLC0415

    made: list[FakeGpuProber] = []

    def fake_prober(
        job: object, host: str, inventory: object, workdir: object, out: object, run_job: object
    ) -> FakeGpuProber:
        assert host == "n1"  # the job's first node
        made.append(FakeGpuProber({Strategy.NONE: 1.3}))
        return made[-1]

    monkeypatch.setattr(engine_probe, "LauncherProber", fake_prober)
    monkeypatch.setenv("MIFT_RUNS_DIR", str(tmp_path / "runs"))
    path = _job(tmp_path, "deepspeed: auto\nplan: auto\n")
    assert _cli([str(path), "--hardware", "h200", "--probe", "--probe-steps", "3"]) == 0
    text = capsys.readouterr().out
    assert "Probe (3 steps each, budget 120 s)" in text
    assert "Picked by measurement: no DeepSpeed (DDP), micro-batch 16" in text
    assert [steps for _, steps, _ in made[0].calls] == [3, 3]  # 2 candidates by default
    assert _cli([str(path), "--hardware", "h200", "--probe", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) >= {"strategies", "choice", "training_plan"}
    probe = out["training_plan"]["probe"]
    assert probe["pick"]["strategy"] == "none"
    assert [r["status"] for r in probe["runs"]] == ["measured", "measured"]
    assert out["training_plan"]["choice"] == "none"


def test_the_probe_candidates_share_one_preflight(tmp_path: Path, monkeypatch):
    """Preflight runs once for the probe: later candidates on the same node reuse its facts, as copies."""
    import launcher.engine.attempts as attempts  # noqa: PLC0415
    import launcher.engine.run as steps  # noqa: PLC0415
    from launcher.preflight.checks import PreflightOnce, facts_of_host  # noqa: PLC0415
    from launcher.rundir.runs import exit_code_of  # noqa: PLC0415

    job_path = _job(tmp_path, "deepspeed: none\n")
    preflights: list[str] = []
    shipped: list[list[str]] = []

    def preflight_on_the_h200(runner: object, spec: object, run_id: str, **_: object) -> object:
        preflights.append(run_id)
        return _h200()

    def ship(run: object, runner: object, plan: object, *, lease: object = None, **_: object) -> int:
        leased.append(lease is not None)  # the launch takes the GPU lease (launcher.engine.lease)
        shipped.append(plan.facts.hosts)  # type: ignore[attr-defined]
        plan.facts.notes.append("changed by this run")  # type: ignore[attr-defined]
        return 0

    monkeypatch.setenv("MIFT_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setattr(steps, "run_preflight", preflight_on_the_h200)
    monkeypatch.setattr(attempts, "ship_and_follow", ship)
    leased: list[bool] = []
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all:\n  hosts:\n    n1: {ansible_host: 127.0.0.1}\n")
    once = PreflightOnce()
    for _ in range(3):
        out = io.StringIO()
        run = steps.run_job(job_path, inventory=inventory, detach=False, out=out, preflight_once=once)
        assert exit_code_of(run.load().get("status")) == 0  # run_job returns the run directory
    assert len(preflights) == 1 and shipped == [["n1"]] * 3 and leased == [True] * 3
    assert once.facts is not None and "changed by this run" not in once.facts.notes  # runs change copies
    assert once.reuse(["n1", "n2"]) is None  # other hosts: preflight
    assert once.reuse("n1") is None  # a pattern (the inventory decides what it matches): preflight

    two = _h200()
    two.hosts, two.train_address["n2"], two.torch["n2"] = ["n1", "n2"], "10.0.0.2", {"backend": "cuda"}
    first = facts_of_host(two, "n1")
    assert (first.hosts, sorted(first.train_address), sorted(first.torch)) == (["n1"], ["n1"], ["n1"])
    assert two.hosts == ["n1", "n2"]  # the job's own facts are left as they were
    with pytest.raises(ValueError, match="n3"):
        facts_of_host(two, "n3")
