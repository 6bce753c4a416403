"""What the planner needs on the controller, checked by ``validate``: a job that asks the planner
(``plan: auto``/``probe`` or ``deepspeed: auto``) needs the model's ``config.json`` here.

``plan`` and ``run`` read it from the job spec's ``plan_model_config``, else the training YAML's
``model_name_or_path`` when that is a path on this machine, else a bundled config whose pattern matches the
name (:func:`launcher.planning.model.resolve_shape`). A hub id or node path with none of these fails ``run``
at its planning step; ``validate`` says so first, naming what ``plan`` needs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from launcher.exceptions import ConfigurationError
from launcher.problems import Problem

if TYPE_CHECKING:
    from launcher.validation.job import LoadedJob


def planner_inputs_problems(job: LoadedJob) -> list[Problem]:
    """One problem when the job asks the planner and the model's config.json is not on the controller."""
    from launcher.planning.model import resolve_shape  # noqa: PLC0415 - only for jobs that plan

    spec = job.spec
    asks = [f"plan: {spec.plan}"] if spec.plan != "as_written" else []
    if job.deepspeed_from == "auto":
        asks.append("deepspeed: auto")
    if not asks:
        return []
    try:
        resolve_shape(spec.plan_model_config, dict(job.train.data))
    except ConfigurationError as err:
        why = err.problems[0].message if err.problems else str(err)
        if spec.plan_model_config is not None:
            key, value = "plan_model_config", f"{spec.plan_model_config} ({' and '.join(asks)})"
        elif spec.plan != "as_written":
            key, value = "plan", spec.plan + (" (and deepspeed: auto)" if len(asks) > 1 else "")
        else:
            key, value = "deepspeed", "auto"
        return [
            Problem(
                str(job.spec_path),
                key,
                f"{value}: the planner needs the model's config.json on this controller, and {why} (the "
                "config.json alone is enough)",
                "plan-model-config",
            )
        ]
    return []
