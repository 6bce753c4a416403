"""Preflight: check every node of a job before anything starts.

Reachable, same stack, GPUs, the folders the job needs (model, resume checkpoint, dataset), port, disk.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from launcher.exceptions import ConfigurationError, JobFailedError
from launcher.preflight.nodeenv import mi300x_env, provisioned_env, resolve_nproc
from launcher.preflight.tokenizer_check import tokenizer_refusal
from launcher.preflight.torch_answers import TorchAnswers
from launcher.preflight.torchinfo import cuda_hosts, cuda_note, torch_gpu_mem_gib, torch_stack
from launcher.problems import Problem

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from launcher.backends.runner import PlaybookRunner
    from launcher.spec.jobspec import JobSpec

# stack fact keys that differ per host by nature and are not versions
_NOT_VERSIONS = ("host", "hostname", "time", "date", "checked", "path", "node")
GIB = 1024**3
# what a Hugging Face model folder holds: its config and its weights (one file, or an index and its shards)
MODEL_FILES = (
    ("config.json",),
    (
        "model.safetensors",
        "model.safetensors.index.json",
        "pytorch_model.bin",
        "pytorch_model.bin.index.json",
    ),
)
ADAPTER_FILES = (("adapter_config.json",), ("adapter_model.safetensors", "adapter_model.bin"))
# a checkpoint the Trainer resumes from: trainer_state.json is written last (the probe's COMPLETE_MARKER),
# then DeepSpeed's global_step* folder (transformers' deepspeed_load_checkpoint), else the weights
# (transformers' _load_from_checkpoint)
CHECKPOINT_WEIGHTS = (
    "model.safetensors",
    "adapter_model.safetensors",
    "pytorch_model.bin",
    "adapter_model.bin",
    "model.safetensors.index.json",
    "pytorch_model.bin.index.json",
)
# LLaMA-Factory's dataset_dir values that are not a folder on the node
DATASET_DIR_NOT_LOCAL = ("REMOTE:", "none")
DEFAULT_DATASET_DIR = "data"  # LLaMA-Factory's default, relative to the trainer's working directory


@dataclass(frozen=True)
class NodePath:
    """A folder every node of the job must hold before the start, checked by preflight's probe.

    Attributes:
        what: the key that names it (``model_name_or_path``, ``resume``, ``dataset_dir``).
        path: the node path as the trainer gets it (relative: in the node run directory, its working
            directory).
        files: groups of file names or globs; one of each group must be in the folder.
        datasets: names the folder's ``dataset_info.json`` must list (with their local files).
    """

    what: str
    path: str
    files: tuple[tuple[str, ...], ...] = ()
    datasets: tuple[str, ...] = ()
    # the model folder only: the training YAML's trust_remote_code (the probe loads its tokenizer so)
    trust_remote_code: bool = False
    hub: str = ""  # a hub id: its complete snapshot in the node's Hugging Face cache (``cache``: the job's)
    cache: str = ""
    revision: str = ""  # the training YAML's model_revision (LLaMA-Factory's default: main)

    def as_extravar(self) -> dict[str, Any]:
        """Return the requirement as the probe reads it (``--require``)."""
        return {
            k: [list(g) for g in v] if k == "files" else v
            for k, v in asdict(self).items()
            if k != "trust_remote_code" and (v or k not in ("hub", "cache", "revision"))
        }


def _is_local_path(value: str) -> bool:
    """True for what transformers opens as a folder, not a hub id: absolute, ``./``, ``../``."""
    return value.startswith(("/", "./", "../")) or value in (".", "..")


def _hub_cache_of(spec: JobSpec) -> str:
    """The node Hugging Face cache the job's own env names (``HF_HUB_CACHE``, ``HF_HOME``/hub), else ``""``:
    the node's default, as the trainer finds it."""
    env = spec.env_strings()
    if env.get("HF_HUB_CACHE"):
        return env["HF_HUB_CACHE"]
    return f"{env['HF_HOME'].rstrip('/')}/hub" if env.get("HF_HOME") else ""


def _names(value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        return tuple(n.strip() for n in value.split(",") if n.strip())
    if isinstance(value, list):
        return tuple(str(n).strip() for n in value if str(n).strip())
    return ()


def node_paths(
    train: Mapping[str, Any], spec: JobSpec, *, deepspeed: bool | None, resume_run: bool = False
) -> list[NodePath]:
    """Return the folders the job's trainers open at start, to be found on every node by preflight.

    Args:
        train: the training YAML as read.
        spec: the job spec (``resume``: a named checkpoint).
        deepspeed: the run uses DeepSpeed (True), does not (False), or the planner decides later (None).
        resume_run: ``run --resume``: the checkpoint is found by listing the resumed run's output_dir instead.
    """
    out = []
    model = train.get("model_name_or_path")
    if isinstance(model, str) and _is_local_path(model):
        trust = train.get("trust_remote_code") is True
        out.append(NodePath("model_name_or_path", model, MODEL_FILES, trust_remote_code=trust))
    elif isinstance(model, str) and model:  # a hub id, opened offline on the node: from its cache only
        revision = str(train.get("model_revision") or "main")
        out.append(
            NodePath(
                "model_name_or_path",
                model,
                MODEL_FILES,
                hub=model,
                cache=_hub_cache_of(spec),
                revision=revision,
            )
        )
    adapters = train.get("adapter_name_or_path")
    for adapter in _names(adapters) if isinstance(adapters, str) else ():
        if _is_local_path(adapter):
            out.append(NodePath("adapter_name_or_path", adapter, ADAPTER_FILES))
    if isinstance(spec.resume, str) and not resume_run:
        weights = {
            True: ("global_step*",),
            False: CHECKPOINT_WEIGHTS,
            None: ("global_step*", *CHECKPOINT_WEIGHTS),
        }
        out.append(NodePath("resume", spec.resume, (("trainer_state.json",), weights[deepspeed])))
    datasets = _names(train.get("dataset")) + _names(train.get("eval_dataset"))
    dataset_dir = train.get("dataset_dir", DEFAULT_DATASET_DIR)
    if (
        datasets
        and isinstance(dataset_dir, str)
        and not train.get("tokenized_path")  # a saved tokenized dataset is loaded instead, when it exists
        and not dataset_dir.startswith(DATASET_DIR_NOT_LOCAL[0])
        and dataset_dir.lower() != DATASET_DIR_NOT_LOCAL[1]
    ):
        out.append(
            NodePath("dataset_dir", dataset_dir, (("dataset_info.json",),), tuple(dict.fromkeys(datasets)))
        )
    return out


def missing_problems(facts: NodeFacts) -> list[Problem]:
    """Return one problem per missing node path, naming every host that lacks it (in rank order)."""
    lacking: dict[tuple[str, str, str], list[str]] = {}
    for host in facts.hosts:
        for item in facts.probe[host].get("missing") or []:
            if isinstance(item, dict):
                key = (str(item.get("what", "")), str(item.get("path", "")), str(item.get("why", "")))
                lacking.setdefault(key, []).append(host)
    return [
        Problem(", ".join(hosts), what, f"{path}: {why}", "node-path")
        for (what, path, why), hosts in lacking.items()
    ]


@dataclass
class NodeFacts:
    """What preflight learnt about the job's nodes, in rank order."""

    hosts: list[str]
    train_address: dict[str, str]
    stack: dict[str, dict[str, Any]]
    gpus: dict[str, dict[str, Any]]
    probe: dict[str, dict[str, Any]]
    nproc_per_node: int = 0
    warnings: list[str] = field(default_factory=list)
    # what each node's trainer torch reports (mift_torch_probe.py), the env each trainer gets (provisioning's
    # runtime env under the inventory's mift_node_env), notes
    torch: dict[str, dict[str, Any]] = field(default_factory=dict)
    node_env: dict[str, dict[str, Any]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def master(self) -> str:
        """Return the rank-0 host."""
        return self.hosts[0]

    def gpu_mem_gib(self, host: str) -> float | None:
        """Return a host's memory per GPU in GiB: the ``mift_gpus`` fact, else what torch reports."""
        gpus = self.gpus.get(host) or {}
        value = gpus.get("memory_gib") or gpus.get("vram_gib")
        return float(value) if value else torch_gpu_mem_gib(self.torch.get(host))


@dataclass
class PreflightOnce:
    """One preflight shared by several runs on the same hosts, one after the other (the probe's candidates).

    The first run that finds no facts for its hosts runs preflight and keeps a copy; a later run on exactly
    those hosts reuses it and skips preflight (an ansible run on every node: seconds per candidate).
    """

    facts: NodeFacts | None = None

    def reuse(self, hosts: str | list[str] | None) -> NodeFacts | None:
        """Return a copy of the kept facts when they are for exactly ``hosts`` (a list), else None."""
        if self.facts is None or not isinstance(hosts, list) or hosts != self.facts.hosts:
            return None
        return copy.deepcopy(self.facts)

    def keep(self, facts: NodeFacts) -> None:
        """Keep a copy of ``facts`` (the run goes on to change its own)."""
        self.facts = copy.deepcopy(facts)


def facts_of_host(facts: NodeFacts, host: str) -> NodeFacts:
    """Return a copy of ``facts`` that holds ``host`` only (one of the job's hosts)."""
    if host not in facts.hosts:
        raise ValueError(f"{host} is not one of {facts.hosts}")
    mine = copy.deepcopy(facts)
    mine.hosts = [host]
    for name in ("train_address", "stack", "gpus", "probe", "torch", "node_env"):
        per_host: dict[str, Any] = getattr(mine, name)
        setattr(mine, name, {host: per_host[host]} if host in per_host else {})
    return mine


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if any(word in str(key).lower() for word in _NOT_VERSIONS):
            continue
        if isinstance(value, dict):
            out.update(_flatten(value, f"{name}."))
        elif not isinstance(value, list):
            out[name] = str(value)
    return out


def _comparable(stack: dict[str, Any]) -> dict[str, str]:
    """Return the fields of a ``mift_stack`` fact that must match across nodes (versions and backend)."""
    if isinstance(stack.get("versions"), dict):
        stack = {"versions": stack["versions"], "backend": stack.get("backend")}
    return _flatten(stack)


def stack_drift(stacks: dict[str, dict[str, Any]], hosts: list[str]) -> list[str]:
    """Return one line per package whose version differs from the first host's (empty: identical)."""
    ref_host = hosts[0]
    ref = _comparable(stacks.get(ref_host, {}))
    problems = []
    for host in hosts[1:]:
        mine = _comparable(stacks.get(host, {}))
        for key in sorted(set(ref) | set(mine)):
            if ref.get(key) != mine.get(key):
                problems.append(
                    f"{host}: {key} is {mine.get(key, 'missing')} ({ref_host}: {ref.get(key, 'missing')})"
                )
    return problems


def run_preflight(
    runner: PlaybookRunner,
    spec: JobSpec,
    run_id: str,
    *,
    output_dir: str | None = None,
    checkpoints_of: str | None = None,
    requires: Sequence[NodePath] = (),
    probe_args: Sequence[str] = (),
) -> NodeFacts:
    """Run the preflight playbook (read-only on the nodes) and check its facts; errors name the host.

    Args:
        runner: the run's playbook runner.
        spec: the job spec.
        run_id: the new run's id (node paths relative to its node run directory).
        output_dir: the node output_dir when it is not the spec's (``run --resume``).
        checkpoints_of: a node path whose ``checkpoint-N`` folders are listed (``run --resume``).
        requires: the folders every node must hold (:func:`node_paths`), checked by the same probe.
        probe_args: more arguments for the probe (``--gpu-tools``: ``launcher check``).
    """
    extravars: dict[str, Any] = {
        "mift_hosts": spec.host_pattern,
        "mift_run_id": run_id,
        "mift_master_port": spec.master_port,
        "mift_output_dir": output_dir or spec.node_output_dir(run_id),
    }
    if spec.node_venv is not None:  # else the inventory's (preflight.yml, nodelayout)
        extravars["mift_node_venv"] = spec.node_venv
    if checkpoints_of:
        extravars["mift_checkpoints_of"] = checkpoints_of
    if requires:
        extravars["mift_require"] = [r.as_extravar() for r in requires]
    if probe_args:
        extravars["mift_probe_extra_args"] = list(probe_args)
    model = next((r for r in requires if r.what == "model_name_or_path"), None)
    if model is not None:  # a local model folder the job does not stage: its tokenizer, on the first node
        extravars["mift_tokenizer"] = {"path": model.path, "trust_remote_code": model.trust_remote_code}
    torch_answers = TorchAnswers()  # torch is asked again only where what it depends on changed
    extravars["mift_torch_known"] = torch_answers.known()
    result = runner.run("preflight", extravars)
    if runner.cancel_requested.is_set():
        raise JobFailedError("interrupted during preflight; nothing was started")
    if result.unreachable:
        host = result.unreachable[0]
        raise ConfigurationError(f"{host}: {result.failures[host]}; nothing was started")
    if result.failures:
        host, line = next(iter(result.failures.items()))
        raise ConfigurationError(f"{host}: preflight failed: {line}; nothing was started")
    hosts, reports = result.host_reports("preflight", spec.host_pattern)
    facts = NodeFacts(
        hosts=hosts,
        train_address={h: str(reports[h]["train_address"]) for h in hosts},
        stack={h: reports[h].get("stack") or {} for h in hosts},
        gpus={h: reports[h].get("gpus") or {} for h in hosts},
        probe={h: reports[h].get("probe") or {} for h in hosts},
        torch=torch_answers.resolve({h: reports[h].get("torch") or {} for h in hosts}),
        # provisioning's runtime env (flash-attn's Triton switch) and AMD's MI300X settings on ROCm
        # nodes, under the inventory's mift_node_env
        node_env={
            h: {
                **provisioned_env(reports[h].get("flash_attn")),
                **mi300x_env(
                    h,
                    stack=reports[h].get("stack") or {},
                    gpus=reports[h].get("gpus") or {},
                    overrides=reports[h].get("mi300x_env"),
                    tunableop=reports[h].get("tunableop"),
                ),
                **(reports[h].get("node_env") or {}),
            }
            for h in hosts
        },
    )
    apply_torch_facts(facts)
    _check(facts, spec)
    return facts


def apply_torch_facts(facts: NodeFacts) -> None:
    """On nodes whose torch reports CUDA: note that the ROCm checks are skipped, compare torch/CUDA versions.

    ``mift_gpus`` (gfx942 verification) and ``mift_stack`` (the ROCm stack) come from provisioning ROCm nodes;
    a CUDA node has neither, so its torch's versions stand in for the stack fact and the GPU count comes from
    torch (:func:`launcher.preflight.nodeenv.resolve_nproc`). A job mixing CUDA and ROCm nodes is refused.
    """
    cuda = cuda_hosts(facts.hosts, facts.torch)
    if not cuda:
        return
    for host in cuda:
        if not facts.stack.get(host):
            facts.stack[host] = torch_stack(facts.torch[host])
    facts.notes.append(cuda_note(cuda, facts.torch))


def installed_drift(host: str, stack: dict[str, Any], probe: dict[str, Any]) -> list[str]:
    """Return one line per package whose installed version (fresh probe) differs from the provisioned fact."""
    recorded = stack.get("versions")
    fresh = probe.get("versions")
    if not isinstance(recorded, dict) or not isinstance(fresh, dict):
        return []
    return [
        f"{host}: {dist} is {fresh.get(dist) or 'not installed'} but was "
        f"{recorded.get(dist) or 'not installed'} when provisioned (the stack changed since provision.yml)"
        for dist in sorted(recorded)
        if dist in fresh and str(fresh.get(dist)) != str(recorded.get(dist))
    ]


def _fresh_stack(stack: dict[str, Any], probe: dict[str, Any]) -> dict[str, Any]:
    """Return the stack fact with its versions replaced by the fresh probe's (when the probe has them)."""
    fresh = probe.get("versions")
    if not stack or not isinstance(fresh, dict):
        return stack
    recorded = stack.get("versions")
    return {**stack, "versions": {**(recorded if isinstance(recorded, dict) else {}), **fresh}}


def _gpu_unverified(gpus: dict[str, Any]) -> str | None:
    """Return why a ``mift_gpus`` fact says the node's GPUs failed verification (None: passed or no fact)."""
    if str(gpus.get("verified", "")).lower() not in ("false", "0", "no"):
        return None
    failures = gpus.get("failures")
    first = failures[0] if isinstance(failures, list) and failures else None
    arch = gpus.get("arch") or "unknown"
    return " ".join(str(first).split()) if first else f"GPU verification failed (arch {arch})"


def _refuse_missing(facts: NodeFacts) -> None:
    """Refuse the job when a folder it needs is missing on a node (a problem per folder, naming its hosts)."""
    missing = missing_problems(facts)
    if missing:  # the CLI prints them on one line
        line = "; ".join(str(p) for p in missing)
        raise ConfigurationError(f"{line}; nothing was started", problems=missing)


def _refuse_tokenizer(facts: NodeFacts) -> None:
    """The job's tokenizer did not load on the first node (preflight/tokenizer_check.py): one line."""
    refusal = tokenizer_refusal(facts.master, facts.probe[facts.master].get("tokenizer"))
    if refusal is not None:
        raise ConfigurationError(refusal)


def _check(facts: NodeFacts, spec: JobSpec) -> None:
    for host in facts.hosts:
        probe = facts.probe[host]
        if not probe.get("trainer_cli_found"):
            raise ConfigurationError(
                f"{host}: {probe.get('trainer_cli')} not found: provision the node (ansible-playbook "
                "provision.yml)"
            )
    with_stack = [h for h in facts.hosts if facts.stack[h]]
    if not with_stack:
        facts.warnings.append(
            "no node has stack facts (mift_stack): versions not compared; run provision.yml"
        )
    else:
        for host in with_stack:  # a fresh probe: the fact is what provisioning saw, not what is there now
            changed = installed_drift(host, facts.stack[host], facts.probe[host])
            if changed:
                raise ConfigurationError(f"{changed[0]}; re-run provision.yml")
        fresh = {h: _fresh_stack(facts.stack[h], facts.probe[h]) for h in facts.hosts}
        drift = stack_drift(fresh, facts.hosts)
        if drift:
            raise ConfigurationError(f"stack versions differ across nodes: {drift[0]}; re-run provision.yml")
    for (
        host
    ) in facts.hosts:  # explicit nproc_per_node or not: a node whose GPUs failed verification is refused
        why = _gpu_unverified(facts.gpus[host])
        if why:
            raise ConfigurationError(
                f"{host}: GPUs not verified (ansible_local.mift_gpus): {why}; fix the node or leave it out "
                "of hosts"
            )
    _refuse_missing(facts)
    _refuse_tokenizer(facts)
    for host in facts.hosts:
        probe = facts.probe[host]
        free = int(probe.get("free_bytes") or 0)
        if free < spec.min_free_disk_gb * GIB:
            raise ConfigurationError(
                f"{host}: only {free / GIB:.1f} GiB free for output_dir, the job spec asks for "
                f"{spec.min_free_disk_gb} GiB (min_free_disk_gb)"
            )
    master_probe = facts.probe[facts.master]
    if master_probe.get("port_free") is False:
        raise ConfigurationError(
            f"{facts.master}: master_port {spec.master_port} is in use; pick another master_port in the "
            "job spec"
        )
    facts.nproc_per_node = resolve_nproc(spec, facts.gpus, facts.hosts, facts.stack, facts.torch)
