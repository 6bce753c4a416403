"""Cross-field rules: combinations that each file's schema accepts but training refuses or misreads.

Each rule is a named function returning problems; the names appear as ``Problem.rule`` and in
``docs/validation.md``. Messages quote the refusing tool where it has one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from launcher.validation.problems import Problem, Severity

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from launcher.validation.deepspeed_facts import DeepSpeedFacts

BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
TRUTHY_ENV = ("1", "true", "y", "yes")


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


# --- DeepSpeed file rules -------------------------------------------------------------------------


def offload_param_needs_zero3(path: str, ds: DeepSpeedFacts) -> list[Problem]:
    """``offload_param`` partitions parameters to CPU/NVMe, which only ZeRO-3 does."""
    if ds.offload_param and ds.stage < 3:
        return [
            Problem(
                path,
                "zero_optimization.offload_param",
                f"parameter offload needs ZeRO stage 3 (stage is {ds.stage})",
                "offload-param-needs-zero3",
            )
        ]
    return []


def bf16_and_fp16(path: str, ds: DeepSpeedFacts) -> list[Problem]:
    """DeepSpeed asserts 'bfloat16 and fp16 modes cannot be simultaneously enabled'."""
    if ds.fp16 is True and ds.bf16 is True:
        return [Problem(path, "bf16.enabled", "bf16 and fp16 cannot both be enabled", "bf16-and-fp16")]
    return []


def batch_values(path: str, ds: DeepSpeedFacts) -> list[Problem]:
    """Batch sizes are positive integers or "auto" (filled by the HF integration LLaMA-Factory uses)."""
    problems = []
    for key in BATCH_KEYS:
        value = ds.values.get(key)
        if value is None or value == "auto":
            continue
        if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0 or value % 1:
            problems.append(
                Problem(path, key, f'must be a positive integer or "auto", got {value!r}', "batch-values")
            )
    return problems


def batch_size_consistency(path: str, ds: DeepSpeedFacts) -> list[Problem]:
    """``train_batch_size`` = micro batch x gradient accumulation x world size, so it must be a multiple."""
    numbers = [ds.values.get(k) for k in BATCH_KEYS]
    if not all(isinstance(v, int | float) and not isinstance(v, bool) and v > 0 for v in numbers):
        return []
    train, micro, accum = (int(v) for v in numbers)  # type: ignore[arg-type]
    step = micro * accum
    if train % step:
        return [
            Problem(
                path,
                "train_batch_size",
                f"{train} is not a multiple of train_micro_batch_size_per_gpu x gradient_accumulation_steps "
                f'= {step} (train_batch_size = micro x accumulation x world size); set it to "auto"',
                "batch-size-consistency",
            )
        ]
    return []


DEEPSPEED_RULES: tuple[Callable[[str, DeepSpeedFacts], list[Problem]], ...] = (
    offload_param_needs_zero3,
    bf16_and_fp16,
    batch_values,
    batch_size_consistency,
)


def deepspeed_rules(path: str, ds: DeepSpeedFacts) -> list[Problem]:
    """Run every DeepSpeed file rule."""
    return [p for rule in DEEPSPEED_RULES for p in rule(path, ds)]


# --- LLaMA-Factory YAML rules (``ds`` is the referenced DeepSpeed config, when there is one) --------


def pure_bf16_zero3(path: str, cfg: Mapping[str, Any], ds: DeepSpeedFacts | None) -> list[Problem]:
    """LLaMA-Factory: "`pure_bf16` is incompatible with DeepSpeed ZeRO-3."."""
    if cfg.get("pure_bf16") is True and ds is not None and ds.stage == 3:
        return [
            Problem(path, "pure_bf16", "`pure_bf16` is incompatible with DeepSpeed ZeRO-3", "pure-bf16-zero3")
        ]
    return []


def predict_with_generate_zero3(
    path: str, cfg: Mapping[str, Any], ds: DeepSpeedFacts | None
) -> list[Problem]:
    """LLaMA-Factory: "`predict_with_generate` is incompatible with DeepSpeed ZeRO-3."."""
    if cfg.get("predict_with_generate") is True and ds is not None and ds.stage == 3:
        return [
            Problem(
                path,
                "predict_with_generate",
                "`predict_with_generate` is incompatible with DeepSpeed ZeRO-3",
                "predict-with-generate-zero3",
            )
        ]
    return []


def unsloth_zero3(path: str, cfg: Mapping[str, Any], ds: DeepSpeedFacts | None) -> list[Problem]:
    """LLaMA-Factory: "Unsloth is incompatible with DeepSpeed ZeRO-3."."""
    if cfg.get("use_unsloth") is True and ds is not None and ds.stage == 3:
        return [
            Problem(path, "use_unsloth", "Unsloth is incompatible with DeepSpeed ZeRO-3", "unsloth-zero3")
        ]
    return []


def optimizer_tricks_deepspeed(path: str, cfg: Mapping[str, Any], ds: DeepSpeedFacts | None) -> list[Problem]:
    """LLaMA-Factory refuses GaLore and APOLLO under DeepSpeed."""
    if ds is None:
        return []
    return [
        Problem(path, key, f"`{key}` is incompatible with DeepSpeed", "optimizer-tricks-deepspeed")
        for key in ("use_galore", "use_apollo")
        if cfg.get(key) is True
    ]


def bf16_and_fp16_yaml(path: str, cfg: Mapping[str, Any], ds: DeepSpeedFacts | None) -> list[Problem]:
    """transformers refuses ``bf16`` and ``fp16`` together."""
    del ds
    if cfg.get("bf16") is True and cfg.get("fp16") is True:
        return [Problem(path, "fp16", "bf16 and fp16 cannot both be true", "bf16-and-fp16")]
    return []


def hf_values_match(path: str, cfg: Mapping[str, Any], ds: DeepSpeedFacts | None) -> list[Problem]:
    """Numeric DeepSpeed values must equal the training arguments (the HF integration refuses a mismatch).

    transformers: "Please correct the following DeepSpeed config values that mismatch TrainingArguments
    values ... The easiest method is to set these DeepSpeed config values to 'auto'."
    """
    if ds is None:
        return []
    pairs = (
        ("train_micro_batch_size_per_gpu", "per_device_train_batch_size", 8),
        ("gradient_accumulation_steps", "gradient_accumulation_steps", 1),
        ("gradient_clipping", "max_grad_norm", 1.0),
    )
    problems = []
    for ds_key, yaml_key, default in pairs:
        ds_value = ds.values.get(ds_key)
        yaml_value = cfg.get(yaml_key, default)
        if _is_number(ds_value) and _is_number(yaml_value) and float(ds_value) != float(yaml_value):  # type: ignore[arg-type]
            problems.append(
                Problem(
                    path,
                    yaml_key,
                    f'{yaml_value} but the DeepSpeed config sets {ds_key}={ds_value}; set it to "auto" there',
                    "hf-values-match",
                )
            )
    for block, flag in (("bf16", ds.bf16), ("fp16", ds.fp16)):
        if isinstance(flag, bool) and flag != bool(cfg.get(block, False)):
            problems.append(
                Problem(
                    path,
                    block,
                    f"{bool(cfg.get(block, False))} but the DeepSpeed config sets {block}.enabled={flag}; "
                    'set it to "auto" there',
                    "hf-values-match",
                )
            )
    return problems


# ddp_timeout (seconds) is how long a rank waits in one collective before it fails; a rank stuck in a
# collective (a peer's GPU hang, a half-dead link) idles every node this long. Above DDP_TIMEOUT_WARN_S
# validation warns and recommends DDP_TIMEOUT_RECOMMENDED_S: above the longest wait between two collectives
# of a normal run (a ZeRO-3 checkpoint save, an evaluation pass, the main process tokenizing the dataset while
# the others wait: preprocess a dataset that takes longer once, with tokenized_path), short enough that a hang
# ends the run within the hour (docs/validation.md "ddp-timeout-hides-hangs").
DDP_TIMEOUT_WARN_S = 7200
DDP_TIMEOUT_RECOMMENDED_S = 3600


def _duration(seconds: float) -> str:
    for unit, size in (("years", 365 * 86400), ("days", 86400), ("h", 3600)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds / 60:.0f} min"


def ddp_timeout_hides_hangs(path: str, cfg: Mapping[str, Any], ds: DeepSpeedFacts | None) -> list[Problem]:
    """A ``ddp_timeout`` far above a hang window lets a stuck collective idle the cluster (warning)."""
    del ds
    value = cfg.get("ddp_timeout")
    if not isinstance(value, int | float) or isinstance(value, bool) or value <= DDP_TIMEOUT_WARN_S:
        return []
    return [
        Problem(
            path,
            "ddp_timeout",
            f"{value} s ({_duration(float(value))}): a rank stuck in a collective would idle every node that "
            f"long before anything fails; set {DDP_TIMEOUT_RECOMMENDED_S} (1 h), above the longest wait of a "
            f"normal run (checkpoint save, evaluation, dataset tokenizing)",
            "ddp-timeout-hides-hangs",
            Severity.WARNING,
        )
    ]


# experiment trackers that need a server on the internet (or the cluster's network) while the trainer runs;
# the nodes are offline by design (HF_HUB_OFFLINE, no route out): TensorBoard writes files, collected after
# the run (docs/launcher.md "Experiment trackers")
ONLINE_TRACKERS = ("wandb", "mlflow", "comet_ml", "neptune", "clearml", "dagshub", "swanlab", "trackio")


def _trackers(value: object) -> list[str]:
    names = value.split(",") if isinstance(value, str) else value if isinstance(value, list) else []
    return [str(n).strip() for n in names if str(n).strip()]


def online_tracker_offline_nodes(
    path: str, cfg: Mapping[str, Any], ds: DeepSpeedFacts | None
) -> list[Problem]:
    """``report_to: wandb`` (mlflow, ...) fails or hangs on nodes that cannot reach its server; refused with
    what works (``tensorboard``, collected into the run directory)."""
    del ds
    named = _trackers(cfg.get("report_to"))
    online = [n for n in named if n in ONLINE_TRACKERS or n == "all"]
    if cfg.get("use_swanlab") is True:
        online.append("swanlab (use_swanlab)")
    if not online:
        return []
    kept = [n for n in named if n not in online]
    instead = ", ".join([*dict.fromkeys([*kept, "tensorboard"])])
    return [
        Problem(
            path,
            "report_to",
            f"{', '.join(online)}: the nodes are offline by design, the tracker would fail or hang at the "
            f"trainer; use report_to: {instead} (its event files are collected into runs/<run_id>/nodes: "
            "tensorboard --logdir runs/<run_id>/nodes) or none",
            "online-tracker-offline-nodes",
        )
    ]


LLAMAFACTORY_RULES: tuple[Callable[[str, Mapping[str, Any], DeepSpeedFacts | None], list[Problem]], ...] = (
    pure_bf16_zero3,
    predict_with_generate_zero3,
    unsloth_zero3,
    optimizer_tricks_deepspeed,
    bf16_and_fp16_yaml,
    hf_values_match,
    ddp_timeout_hides_hangs,
    online_tracker_offline_nodes,
)


def llamafactory_rules(path: str, cfg: Mapping[str, Any], ds: DeepSpeedFacts | None) -> list[Problem]:
    """Run every LLaMA-Factory YAML rule."""
    return [p for rule in LLAMAFACTORY_RULES for p in rule(path, cfg, ds)]


# --- launch rules ----------------------------------------------------------------------------------


def deepspeed_needs_torchrun(path: str, uses_deepspeed: bool, env: Mapping[str, str]) -> list[Problem]:
    """LLaMA-Factory: "Please use `FORCE_TORCHRUN=1` to launch DeepSpeed training.".

    The launcher always sets ``FORCE_TORCHRUN=1``; an environment that turns it off with DeepSpeed set
    is refused here rather than by LLaMA-Factory on every node.
    """
    value = env.get("FORCE_TORCHRUN")
    if uses_deepspeed and value is not None and str(value).strip().lower() not in TRUTHY_ENV:
        return [
            Problem(
                path,
                "env.FORCE_TORCHRUN",
                f"DeepSpeed training must be launched with torchrun (FORCE_TORCHRUN=1), got {value!r}",
                "deepspeed-needs-torchrun",
            )
        ]
    return []
