"""Validate files and folders of configs: the library entry point the commands reuse."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from launcher.exceptions import ConfigurationError
from launcher.problems import ConfigKind, FileReport, Problem
from launcher.spec.config_io import load_config_file
from launcher.validation import backends, rules
from launcher.validation.deepspeed import validate_deepspeed
from launcher.validation.kinds import CONFIG_SUFFIXES, detect_kind
from launcher.validation.llamafactory import validate_llamafactory
from launcher.validation.plan_inputs import planner_inputs_problems

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from launcher.validation.job import LoadedJob


def expand(paths: Iterable[str | Path]) -> list[tuple[Path, bool]]:
    """Return the files to validate, each with whether it was named explicitly.

    Folders become their ``.json``/``.yaml``/``.yml`` files, recursively and sorted (symlink loops and
    unreadable sub-folders are skipped).
    """
    out: list[tuple[Path, bool]] = []
    for item in paths:
        path = Path(item)
        if path.is_dir():
            found = sorted(p for p in _walk(path) if p.suffix.lower() in CONFIG_SUFFIXES)
            out.extend((p, False) for p in found)
        else:
            out.append((path, True))
    return out


def _walk(folder: Path) -> list[Path]:
    found: list[Path] = []
    for root, _dirs, files in os.walk(folder):  # symlinked folders are not followed: no loop
        found.extend(Path(root) / name for name in files)
    return found


def _rejected_fast(check: Callable[..., FileReport], path: Path, builtin: bool | None) -> FileReport | None:
    """A report with errors from the shipped key lists, when they speak for the installed real classes.

    When the real classes are selected (``builtin`` None, not forced) and the lists were generated from the
    very versions installed, a file the lists reject is reported at once, without importing the real classes;
    a file they accept is then checked with the real classes (whose verdict is cached: :mod:`.cache`).
    """
    if builtin is not None or backends.builtin_forced() or not backends.shipped_lists_match_installed():
        return None
    quick = check(path, builtin=True)
    return None if quick.ok else quick


def validate_loaded(job: LoadedJob, *, builtin: bool | None = None) -> FileReport:
    """Validate a loaded job spec and the configs it uses (the objects the engine ships, not a re-read)."""
    spec, train = job.spec, job.train
    report = FileReport(str(job.spec_path), ConfigKind.JOBSPEC)
    chosen = (job.deepspeed.label, job.deepspeed.data) if job.deepspeed else (job.deepspeed_from, None)
    sub = validate_llamafactory(
        dict(train.data), train.label, train.path.parent, builtin=builtin, chosen_deepspeed=chosen
    )
    report.problems.extend(sub.problems)
    report.problems.extend(
        rules.deepspeed_needs_torchrun(str(job.spec_path), job.deepspeed is not None, spec.env_strings())
    )
    report.summary = f"{spec.name}: {sub.summary}"
    return report


def validate_jobspec(path: Path, *, builtin: bool | None = None) -> FileReport:
    """Validate a job spec and the configs it names (errors the shipped lists find come back at once)."""
    return _rejected_fast(_validate_jobspec, path, builtin) or _validate_jobspec(path, builtin=builtin)


def validate_file(path: Path, *, builtin: bool | None = None) -> FileReport:
    """Validate one file of any supported kind, detected from its content (errors the shipped lists find
    come back at once)."""
    return _rejected_fast(_validate_file, path, builtin) or _validate_file(path, builtin=builtin)


def _validate_jobspec(path: Path, *, builtin: bool | None = None) -> FileReport:
    """Load the job spec as ``run`` does (:func:`launcher.validation.job.load_job`), then validate it."""
    from launcher.validation.job import load_job  # noqa: PLC0415 - the job spec model is needed only here

    try:
        job = load_job(path)
    except ConfigurationError as err:
        return FileReport(str(path), ConfigKind.JOBSPEC, problems=list(err.problems))
    report = validate_loaded(job, builtin=builtin)
    report.problems.extend(planner_inputs_problems(job))  # validate only: `run` fails at its planning step
    return report


def _validate_file(path: Path, *, builtin: bool | None = None) -> FileReport:
    """Validate one file of any supported kind (detected from its content)."""
    name = str(path)
    try:
        data = load_config_file(path)
    except ConfigurationError as err:
        return FileReport(name, ConfigKind.UNKNOWN, problems=list(err.problems))
    kind = detect_kind(path, data)
    if kind is ConfigKind.DEEPSPEED:
        return validate_deepspeed(data, name, builtin=builtin)
    if kind is ConfigKind.LLAMAFACTORY:
        return validate_llamafactory(data, name, path.parent, builtin=builtin)
    if kind is ConfigKind.JOBSPEC:
        return _validate_jobspec(path, builtin=builtin)
    if kind is ConfigKind.ACCELERATE:
        return FileReport(name, kind, validated=False)
    report = FileReport(name, kind)
    report.problems.append(
        Problem(
            name,
            "(file)",
            "not a DeepSpeed JSON, LLaMA-Factory YAML, job spec or accelerate config (no telling keys found)",
            "kind",
        )
    )
    return report


def validate_files(paths: Iterable[str | Path], *, builtin: bool | None = None) -> list[FileReport]:
    """Validate every file (folders expanded); one report per file, in order.

    Files found in a folder whose kind is not recognised (a dataset's JSON, say) are skipped; a file named
    explicitly is always reported. A folder in which nothing was validated gets a report with one error: a
    validation that checked nothing is not a pass.
    """
    reports = []
    for item in paths:
        found = []
        for path, explicit in expand([item]):
            report = validate_file(path, builtin=builtin)
            if (
                explicit
                or report.kind is not ConfigKind.UNKNOWN
                or any(p.rule != "kind" for p in report.problems)
            ):
                found.append(report)
        if not any(r.validated or not r.ok for r in found):
            message = "nothing validated: no job spec, LLaMA-Factory YAML or DeepSpeed JSON found here"
            found.append(
                FileReport(str(item), ConfigKind.UNKNOWN, problems=[Problem(str(item), "", message, "empty")])
            )
        reports.extend(found)
    return reports


def validate_paths(paths: Iterable[str | Path], *, builtin: bool | None = None) -> list[Problem]:
    """Return every problem (errors and warnings) in the given files, each once, in order."""
    seen: set[tuple[str, str, str]] = set()
    out: list[Problem] = []
    for report in validate_files(paths, builtin=builtin):
        for problem in report.problems:
            if problem.identity not in seen:
                seen.add(problem.identity)
                out.append(problem)
    return out
