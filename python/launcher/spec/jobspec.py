"""The job spec: one YAML file that says what to train, with which DeepSpeed config, where and how.

Unknown keys are rejected and the nearest valid key is suggested. Paths to the training YAML and the DeepSpeed
JSON are controller paths, relative to the job spec file; everything inside the training YAML (model, dataset
dir) is a path on the nodes.
"""

from __future__ import annotations

import difflib
import re
import string
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from launcher.follow import recovery
from launcher.follow.watchdog import WatchdogOptions
from launcher.spec.nodelayout import layout

SECRET_RE = re.compile(r"TOKEN|SECRET|KEY|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# a host name, an IPv4 address or an IPv6 address: never anything a shell would read as code
ADDRESS_RE = re.compile(r"^(?:[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252})|[0-9A-Fa-f:.]+)$")
# set by the launcher for every node; a job spec may not override them
RESERVED_ENV = frozenset(
    {"NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "NPROC_PER_NODE", "FORCE_TORCHRUN", "MIFT_RUN_ID"}
)
MASK = "***"
# the fields a job spec's output_dir may name ({run_id}: the run's id, filled in by JobSpec.node_output_dir)
OUTPUT_DIR_FIELDS = ("run_id",)

Port = Annotated[int, Field(ge=1024, le=65535)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Timeouts(_Strict):
    """Deadlines of the launcher's steps, in seconds."""

    start_s: Annotated[int, Field(gt=0)] = 180
    stop_grace_s: Annotated[int, Field(gt=0, le=20)] = 8
    job_s: Annotated[int, Field(ge=0)] = 0  # 0: no limit on the whole job
    teardown_grace_s: Annotated[int, Field(ge=0, le=20)] = 10


class RecoveryPolicy(_Strict):
    """What the launcher does when an attempt fails while it follows the run (launcher.follow.recovery).

    The defaults live in :mod:`launcher.follow.recovery` (one place); ``max_restarts: 0`` switches recovery
    off.
    """

    max_restarts: Annotated[int, Field(ge=0, le=100)] = recovery.DEFAULT_MAX_RESTARTS
    retry_on: tuple[str, ...] = recovery.DEFAULT_RETRY_ON
    backoff_s: Annotated[float, Field(ge=0, le=3600)] = recovery.DEFAULT_BACKOFF_S
    # the same failure (kind and node) this many times in a row ends the run
    same_failure_limit: Annotated[int, Field(ge=2, le=100)] = recovery.DEFAULT_SAME_FAILURE_LIMIT
    # out of memory under plan: auto/probe: the next attempt runs the next plan that fits with a larger margin
    replan_oom: bool = recovery.DEFAULT_REPLAN_OOM
    # an inventory group (or host list) of spare nodes: one takes the place of a node a failure excludes
    # (launcher.follow.recovery.excluded_after); needs output_shared (docs/launcher.md "Spares")
    spares: str | None = None

    @field_validator("retry_on")
    @classmethod
    def _known_kinds(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for kind in value:
            if kind in recovery.NEVER_RETRIED:
                raise ValueError(f"{kind}: {recovery.NEVER_RETRIED[kind]} is never retried")
            if kind in recovery.NOT_IN_RETRY_ON:
                raise ValueError(f"{kind}: {recovery.NOT_IN_RETRY_ON[kind]}")
            if kind not in recovery.FAILURE_KINDS:
                near = difflib.get_close_matches(kind, list(recovery.FAILURE_KINDS), n=1, cutoff=0.5)
                hint = f"; did you mean {near[0]!r}?" if near else ""
                raise ValueError(
                    f"{kind!r} is not a failure kind ({', '.join(recovery.FAILURE_KINDS)}){hint}"
                )
        return tuple(dict.fromkeys(value))

    @property
    def enabled(self) -> bool:
        """True when a failure may be retried at all (re-planning after out of memory is a retry)."""
        return self.max_restarts > 0 and (bool(self.retry_on) or self.replan_oom)


class Telemetry(_Strict):
    """GPU telemetry on every node while the trainer runs (docs/launcher.md "GPU telemetry")."""

    # seconds between two samples of amd-smi / nvidia-smi on a node; 0: off. 30 s costs one tool call (about
    # a second of one CPU core) per half minute per node
    period_s: Annotated[float, Field(ge=0, le=3600)] = 30.0

    @field_validator("period_s")
    @classmethod
    def _not_too_fast(cls, value: float) -> float:
        if 0 < value < 1:
            raise ValueError("must be 0 (off) or at least 1 second")
        return value


SLURM_NAME_RE = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$"
# Slurm's --time formats: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS
SLURM_TIME_RE = r"^(?:\d+|\d+:\d{2}|\d+:\d{2}:\d{2}|\d+-\d+|\d+-\d+:\d{2}|\d+-\d+:\d{2}:\d{2})$"


class SlurmOptions(_Strict):
    """How the ``slurm`` backend asks for the allocation (ignored by the ``ssh`` backend)."""

    partition: Annotated[str, Field(pattern=SLURM_NAME_RE)] | None = None  # None: the cluster's default
    account: Annotated[str, Field(pattern=SLURM_NAME_RE)] | None = None
    # Slurm's --time (minutes, HH:MM:SS, D-HH:MM:SS ...); None: the partition's limit
    time_limit: Annotated[str, Field(pattern=SLURM_TIME_RE)] | None = None
    # --gpus-per-node; None: nproc_per_node when preflight found GPUs, else no GPU request
    gpus_per_node: Annotated[int, Field(ge=0)] | None = None
    # login host only (docs/slurm.md "Login host only"): a folder of the cluster's shared file system, the
    # same path on the login host and every compute node; the run's bundle and node run directories live
    # there, and the launcher reaches nothing but the login host. Needs `nodes` (Slurm picks them).
    shared_dir: str | None = None
    nodes: Annotated[int, Field(ge=1, le=1024)] | None = None  # --nodes; only with shared_dir
    # seconds before the time limit at which the batch script requeues the job while the recovery policy has
    # restarts left (sbatch --signal=B:USR1@N; Slurm may signal up to 60 s earlier); 0: not at the time limit
    requeue_before_s: Annotated[int, Field(ge=0, le=65535)] = 120

    @field_validator("shared_dir")
    @classmethod
    def _shared_absolute(cls, value: str | None) -> str | None:
        if value is not None and (not value.startswith("/") or ".." in PurePosixPath(value).parts):
            raise ValueError("must be an absolute path (the same on the login host and every node)")
        return value.rstrip("/") or "/" if value is not None else None

    @model_validator(mode="after")
    def _nodes_with_shared_dir(self) -> SlurmOptions:
        if self.shared_dir is not None and self.nodes is None:
            raise ValueError("shared_dir (login host only) needs nodes: the node count Slurm allocates")
        if self.nodes is not None and self.shared_dir is None:
            raise ValueError("nodes is the node count of the login-host-only mode: it needs shared_dir")
        return self

    @property
    def login_only(self) -> bool:
        """True when only the login host is reached (the nodes through the shared folder)."""
        return self.shared_dir is not None


HF_REPO_RE = r"^[A-Za-z0-9][A-Za-z0-9_.-]*(?:/[A-Za-z0-9][A-Za-z0-9_.-]*)?$"
HF_REVISION_RE = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$"


SOURCE_KINDS = ("controller", "shared", "hf_cache", "hub")


class StageSource(_Strict):
    """Where one staged folder comes from: exactly one of ``controller``, ``shared``, ``hf_cache``, ``hub``
    (docs/launcher.md "Staging")."""

    # a folder on the controller, relative to the job spec: copied to every node
    controller: Path | None = None
    # a folder every node already sees (a shared file system), the training YAML's own path: verified in place
    shared: str | None = None
    # a Hugging Face repo id in the controller's Hugging Face cache ($HF_HUB_CACHE, $HF_HOME/hub or
    # ~/.cache/huggingface/hub): its snapshot of ``revision`` is copied to every node
    hf_cache: Annotated[str, Field(pattern=HF_REPO_RE)] | None = None
    # a Hugging Face hub repo id (a dataset repo for dataset_dir): fetched once here with huggingface_hub
    # (HF_ENDPOINT, HF_TOKEN or the token file), its revision resolved and recorded (launcher/transfer/hub.py)
    hub: Annotated[str, Field(pattern=HF_REPO_RE)] | None = None
    revision: Annotated[str, Field(pattern=HF_REVISION_RE)] | None = None  # with hf_cache or hub; None: main

    @field_validator("shared")
    @classmethod
    def _shared_absolute(cls, value: str | None) -> str | None:
        if value is not None and (not value.startswith("/") or ".." in PurePosixPath(value).parts):
            raise ValueError("must be an absolute node path")
        return value

    @model_validator(mode="after")
    def _one_source(self) -> StageSource:
        given = [k for k in SOURCE_KINDS if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                "name exactly one source: controller (a folder here), shared (a folder the nodes already "
                "see), hf_cache (a repo id in the Hugging Face cache) or hub (a repo id fetched from the "
                f"hub); got {', '.join(given) or 'none'}"
            )
        if self.revision is not None and self.hf_cache is None and self.hub is None:
            raise ValueError("revision goes with hf_cache or hub only")
        return self

    @property
    def kind(self) -> str:
        """``controller``, ``shared``, ``hf_cache`` or ``hub``."""
        return next(k for k in SOURCE_KINDS if getattr(self, k) is not None)


class Staging(_Strict):
    """The folders the launcher puts on every node, verified, before the trainers start."""

    # to the training YAML's model_name_or_path
    model: StageSource | None = None
    # to the training YAML's dataset_dir (dataset_info.json and the data files it names)
    dataset_dir: StageSource | None = None
    # where the nodes keep their hash cache of staged files (node path)
    node_cache: str = "/var/lib/mift/stage-hashes.json"
    # with model and dataset_dir staged: the first node tokenizes, every node gets the copy of the cache key
    # (launcher/transfer/tokenize_once.py, docs/launcher.md "Tokenize once")
    tokenize_once: bool = True

    @model_validator(mode="after")
    def _dataset_not_hub(self) -> Staging:
        if self.dataset_dir is not None and self.dataset_dir.hf_cache is not None:
            raise ValueError(
                "dataset_dir: hf_cache holds models here; stage a dataset folder with dataset_info.json "
                "from the controller (controller:), a shared folder (shared:) or a hub dataset repo (hub:)"
            )
        return self

    @field_validator("node_cache")
    @classmethod
    def _cache_absolute(cls, value: str) -> str:
        if not value.startswith("/") or ".." in PurePosixPath(value).parts:
            raise ValueError("must be an absolute node path")
        return value

    def items(self) -> list[tuple[str, StageSource]]:
        """The staged folders, by training-YAML key, in a fixed order."""
        return [
            (k, v) for k, v in (("model", self.model), ("dataset_dir", self.dataset_dir)) if v is not None
        ]


class FabricOptions(_Strict):
    """Which transport the job's collectives should use between nodes, and what a fall-back to sockets does.

    ``transport``: ``auto`` expects RDMA when some node has an active RDMA port or the job's env names
    ``NCCL_IB_HCA``; ``rdma`` always; ``socket`` never. ``socket_fallback``: a multi-node job whose transport
    is sockets where RDMA is expected is refused (``fail``) or runs with one warning line (``warn``); the same
    policy judges what RCCL/NCCL chose at run time (``fail``: the run fails, never retried).
    (launcher.fabric.env, launcher.fabric.runtime; docs/launcher.md "Fabric".)
    """

    transport: Literal["auto", "rdma", "socket"] = "auto"
    socket_fallback: Literal["fail", "warn"] = "fail"


# the smoke check's prompts when the job spec names none
MERGE_PROMPTS = ("The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,")


class MergeOptions(_Strict):
    """Job spec ``merge``: merge the adapter into the base model after a successful run
    (launcher/transfer/merge.py,
    docs/launcher.md "Merge after the run"; the one place of the defaults)."""

    # None: merge when the job stages its model (the base is then on every node, verified) and trains LoRA
    enabled: bool | None = None
    # the node that merges; None: the node holding the final adapter (rank 0)
    host: str | None = None
    # cpu: export and check on the CPU; gpu: on the node's GPUs (LLaMA-Factory's export_device auto)
    device: Literal["cpu", "gpu"] = "cpu"
    # the merged model's dtype (LLaMA-Factory's infer_dtype; auto: bf16 where supported, else the model's)
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    prompts: Annotated[list[str], Field(min_length=1, max_length=16)] = Field(
        default_factory=lambda: list(MERGE_PROMPTS)
    )
    max_new_tokens: Annotated[int, Field(ge=1, le=256)] = 16
    timeout_s: Annotated[int, Field(gt=0)] = 6 * 3600

    @field_validator("prompts")
    @classmethod
    def _no_empty_prompt(cls, value: list[str]) -> list[str]:
        if any(not p.strip() for p in value):
            raise ValueError("a prompt is empty")
        return value


class JobSpec(_Strict):
    """A multi-node LLaMA-Factory training job."""

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")]
    train_config: Path
    # None (left out): the training YAML's own ``deepspeed`` file, if it names one (docs/launcher.md,
    # "DeepSpeed")
    deepspeed: Literal["auto", "none"] | Path | None = None
    # as_written: the training YAML's micro-batch, accumulation and checkpointing as they are; auto: the
    # planner re-splits the same global batch (launcher.engine.split, docs/planner.md "Opting in"); probe: as
    # auto, after a few steps of the best candidates on the first node, picked by measurement
    plan: Literal["as_written", "auto", "probe"] = "as_written"
    # the model's config.json (or its folder) on the controller, for the planner, when the training YAML's
    # model_name_or_path is a node path the controller does not have and no bundled config matches it
    plan_model_config: Path | None = None
    # the nodes have liger-kernel: plan auto/probe may switch LLaMA-Factory's enable_liger_kernel on
    plan_liger: bool = False
    hosts: str | list[str] = "trainers"
    nproc_per_node: Annotated[int, Field(gt=0)] | None = None
    master_addr: str | None = None
    master_port: Port = 29500
    env: dict[str, str | int | float | bool] = Field(default_factory=dict)
    # node path; relative paths are inside the node run directory /var/lib/mift/runs/<run_id>/
    output_dir: str = "output"
    # output_dir (absolute) is on a file system every node sees (NFS, Lustre): every rank writes its shards of
    # one checkpoint there, and a node that replaces a lost one reads them (docs/launcher.md "Spares")
    output_shared: bool = False
    resume: bool | str = False
    # one poll (poll.yml, one ansible-playbook run) costs the controller about 0.9 CPU-s for 2 nodes
    # (bench/poll_cost.py): every 5 s is a fifth of a core for as long as the run lasts; every 2 s was half
    poll_interval_s: Annotated[float, Field(ge=0.5, le=60)] = 5.0
    timeouts: Timeouts = Field(default_factory=Timeouts)
    telemetry: Telemetry = Field(default_factory=Telemetry)
    # None: the inventory's mift_node_venv, else /opt/mift/venv
    node_venv: str | None = None
    min_free_disk_gb: Annotated[float, Field(ge=0)] = 1.0
    slurm: SlurmOptions = Field(default_factory=SlurmOptions)
    # retries of a failed attempt, from the last checkpoint complete on every node (docs/launcher.md)
    recovery: RecoveryPolicy = Field(default_factory=RecoveryPolicy)
    # the progress watchdog (launcher/follow/watchdog.py): no optimizer step within its window -> stalled
    watchdog: WatchdogOptions = Field(default_factory=WatchdogOptions)
    # the model and dataset folders every node gets, verified, before the start (docs/launcher.md "Staging")
    stage: Staging = Field(default_factory=Staging)
    fabric: FabricOptions = Field(default_factory=FabricOptions)
    # after a successful run: merge the adapter into the base model and check it (launcher/transfer/merge.py)
    merge: MergeOptions = Field(default_factory=MergeOptions)

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key in value:
            if not ENV_NAME_RE.match(key):
                raise ValueError(f"{key!r} is not a valid environment variable name")
            if key in RESERVED_ENV:
                raise ValueError(f"{key} is set by the launcher; use the job spec field instead")
        return value

    @field_validator("master_addr")
    @classmethod
    def _address(cls, value: str | None) -> str | None:
        if value is not None and not ADDRESS_RE.match(value):
            raise ValueError(f"{value!r} is not an IP address or host name")
        return value

    @field_validator("output_dir")
    @classmethod
    def _no_traversal(cls, value: str) -> str:
        if ".." in PurePosixPath(value).parts:
            raise ValueError("must not contain '..' (it would leave the node run directory)")
        why = template_problem(value, OUTPUT_DIR_FIELDS)
        if why:
            raise ValueError(why)
        if "\0" in value or not value.strip():
            raise ValueError("must be a non-empty path without NUL bytes")
        return value

    @field_validator("resume")
    @classmethod
    def _resume_path(cls, value: bool | str) -> bool | str:
        if isinstance(value, bool):
            return value
        why = resume_path_problem(value)
        if why:
            raise ValueError(why)
        return value

    @model_validator(mode="after")
    def _resume_needs_absolute_output(self) -> JobSpec:
        if self.resume is True and not self.output_dir.startswith("/"):
            raise ValueError(
                "resume: needs an absolute output_dir (a relative one is a fresh directory per run)"
            )
        return self

    @model_validator(mode="after")
    def _spares_need_shared_checkpoints(self) -> JobSpec:
        if self.output_shared and not self.output_dir.startswith("/"):
            raise ValueError(
                "output_shared: needs an absolute output_dir on the shared file system (a relative one is "
                "inside each node's own run directory)"
            )
        if self.recovery.spares is None:
            return self
        if not self.output_shared:
            raise ValueError(
                "recovery.spares: the checkpoints would be on node-local disks (output_dir "
                f"{self.output_dir}), and a lost node's ZeRO shards die with it, so no spare could resume; "
                "put output_dir on a file system every node sees and set output_shared: true"
            )
        if self.recovery.max_restarts == 0:
            raise ValueError("recovery.spares: recovery is off (recovery.max_restarts: 0): no spare is used")
        if self.stage.items():
            raise ValueError(
                "recovery.spares: a spare would lack the folders the job stages (stage:); not supported yet: "
                "put the model and dataset on every node and spare beforehand and drop stage:"
            )
        return self

    @model_validator(mode="after")
    def _login_only(self) -> JobSpec:
        if not self.slurm.login_only:
            return self
        if "hosts" in self.model_fields_set:
            raise ValueError(
                "hosts: names nodes, but with slurm.shared_dir (login host only) Slurm picks them: drop "
                "hosts, slurm.nodes says how many"
            )
        if self.output_dir.startswith("/") and not self.output_dir.startswith(f"{self.slurm.shared_dir}/"):
            raise ValueError(
                f"output_dir: {self.output_dir} is outside slurm.shared_dir {self.slurm.shared_dir}: the "
                "launcher reads the outputs through the shared folder (use a relative output_dir)"
            )
        if self.plan == "probe":
            raise ValueError("plan: probe runs on the first node over ssh; not with slurm.shared_dir")
        if self.resume is not False:
            raise ValueError("resume: not supported with slurm.shared_dir (login host only) yet")
        if self.stage.items():
            raise ValueError("stage: the nodes are not reached with slurm.shared_dir (login host only)")
        return self

    @field_validator("node_venv")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("/"):
            raise ValueError("must be an absolute path on the nodes")
        return value

    def node_output_dir(self, run_id: str) -> str:
        """Return the trainer's output_dir on the nodes for run ``run_id`` (``{run_id}`` filled in)."""
        return self.output_dir.format(run_id=run_id)  # the fields were checked when the spec was read

    @property
    def host_pattern(self) -> str:
        """Return the Ansible host pattern of the job's nodes (order kept)."""
        return self.hosts if isinstance(self.hosts, str) else ",".join(self.hosts)

    def env_strings(self) -> dict[str, str]:
        """Return the extra environment with every value as the string the trainer will see."""
        out = {}
        for key, value in self.env.items():
            out[key] = ("1" if value else "0") if isinstance(value, bool) else str(value)
        return out


def template_problem(value: str, known: tuple[str, ...]) -> str | None:
    """Return why ``value`` cannot be filled with ``str.format`` and the ``known`` fields (None: it can).

    A field not in ``known`` (``{nope}``), a positional one (``{}``, ``{0}``), an attribute or index
    (``{run_id.x}``), a format spec or conversion, and an unpaired brace (write ``{{`` or ``}}`` for a
    literal one) are each refused, in words that name them.
    """
    names = ", ".join(f"{{{k}}}" for k in known)
    try:
        parsed = list(string.Formatter().parse(value))
    except ValueError as err:  # "Single '}' encountered in format string", "expected '}' before end ..."
        return f"{value!r}: a brace that does not pair ({err}); write {{{{ or }}}} for a literal brace"
    for _literal, field_name, spec, conversion in parsed:
        if field_name is None:
            continue
        if field_name not in known:
            kind = "positional field" if not field_name or field_name.isdigit() else "unknown field"
            return f"{kind} {{{field_name}}}; known: {names} (write {{{{ or }}}} for a literal brace)"
        if spec or conversion:
            return f"{{{field_name}}}: no format spec or conversion (write it as {{{field_name}}})"
    return None


# a relative resume path is taken from the trainer's working directory, the new node run directory
# (/var/lib/mift/runs/<run_id>/): only a path that climbs out of it (../RUN/output/checkpoint-N) can exist
def resume_path_problem(value: str) -> str | None:
    """Return why a ``resume`` checkpoint path can never be found on the nodes (None: preflight looks)."""
    if not value.strip() or "\0" in value:
        return "must be true, false or a checkpoint path on the nodes"
    parts = PurePosixPath(value).parts
    if not value.startswith("/") and (not parts or parts[0] != ".."):
        return (
            f"{value}: a relative checkpoint is looked up in the new node run directory "
            f"({layout().run_dir('<run_id>')}/), which holds none; give its absolute path on the nodes (e.g. "
            "<output_dir>/checkpoint-N with an absolute output_dir), or ../<run_id>/output/checkpoint-N"
        )
    return None


def is_secret(name: str) -> bool:
    """Return True for environment names that must never be written in clear."""
    return bool(SECRET_RE.search(name))


def mask_env(env: dict[str, str]) -> dict[str, str]:
    """Return ``env`` with secret values replaced by a mask."""
    return {k: (MASK if is_secret(k) else v) for k, v in env.items()}
