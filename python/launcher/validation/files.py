"""Validate files and folders of configs: the library entry point the commands reuse."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from launcher.exceptions import ConfigurationError
from launcher.validation import backends, rules
from launcher.validation.deepspeed import validate_deepspeed
from launcher.validation.kinds import CONFIG_SUFFIXES, detect_kind
from launcher.validation.llamafactory import validate_llamafactory
from launcher.validation.loading import load_config_file
from launcher.validation.problems import ConfigKind, FileReport, Problem

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable


def expand(paths: Iterable[str | Path]) -> list[tuple[Path, bool]]:
    """Return the files to validate, each with whether it was named explicitly.

    Folders become their ``.json``/``.yaml``/``.yml`` files, recursively and sorted.
    """
    out: list[tuple[Path, bool]] = []
    for item in paths:
        path = Path(item)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in CONFIG_SUFFIXES)
            out.extend((p, False) for p in found)
        else:
            out.append((path, True))
    return out


def _problems_from_error(path: str, err: ConfigurationError) -> list[Problem]:
    """Turn a ``PATH: key: message`` (one per line) error into problems."""
    problems = []
    for line in str(err).splitlines():
        head, sep, rest = line.partition(": ")
        if sep and head.endswith(Path(path).name) and ": " in rest:
            key, _, message = rest.partition(": ")
            problems.append(Problem(path, key, message, "job-spec"))
        elif sep and head.endswith(Path(path).name):
            problems.append(Problem(path, "(file)", rest, "job-spec"))
        else:
            problems.append(Problem(path, "(file)", line, "job-spec"))
    return problems


def _rejected_fast(check: Callable[..., FileReport], path: Path, builtin: bool | None) -> FileReport | None:
    """A report with errors from the shipped key lists, when they speak for the installed real classes.

    Importing DeepSpeed and LLaMA-Factory (torch, transformers) takes 15-50 s on a controller; the shipped
    lists take a second. When the real classes are selected (``builtin`` None, not forced) and the lists were
    generated from the very versions installed, a file the lists reject is reported at once; a file they
    accept is then checked with the real classes as before. Returns None when there is no fast answer.
    """
    if builtin is not None or backends.builtin_forced() or not backends.shipped_lists_match_installed():
        return None
    quick = check(path, builtin=True)
    return None if quick.ok else quick


def validate_jobspec(path: Path, *, builtin: bool | None = None) -> FileReport:
    """Validate a job spec and the configs it names (errors the shipped lists find come back at once)."""
    return _rejected_fast(_validate_jobspec, path, builtin) or _validate_jobspec(path, builtin=builtin)


def validate_file(path: Path, *, builtin: bool | None = None) -> FileReport:
    """Validate one file of any supported kind, detected from its content (errors the shipped lists find
    come back at once)."""
    return _rejected_fast(_validate_file, path, builtin) or _validate_file(path, builtin=builtin)


def _validate_jobspec(path: Path, *, builtin: bool | None = None) -> FileReport:
    """Validate a job spec with :func:`launcher.jobspec.load_job_spec`, then the configs it names."""
    from launcher.jobspec import load_job_spec  # noqa: PLC0415 - the job spec model is needed only here

    report = FileReport(str(path), ConfigKind.JOBSPEC)
    try:
        spec = load_job_spec(path)
    except ConfigurationError as err:
        report.problems.extend(_problems_from_error(str(path), err))
        return report
    override = str(spec.deepspeed) if isinstance(spec.deepspeed, Path) else None
    train = spec.train_config
    try:
        data = load_config_file(train)
    except ConfigurationError as err:
        report.problems.extend(_problems_from_error(str(train), err))
        return report
    sub = validate_llamafactory(data, str(train), builtin=builtin, deepspeed=override)
    report.problems.extend(sub.problems)
    uses_deepspeed = override is not None or bool(data.get("deepspeed")) if isinstance(data, dict) else False
    report.problems.extend(rules.deepspeed_needs_torchrun(str(path), uses_deepspeed, spec.env_strings()))
    report.summary = f"{spec.name}: {sub.summary}"
    return report


def _validate_file(path: Path, *, builtin: bool | None = None) -> FileReport:
    """Validate one file of any supported kind (detected from its content)."""
    name = str(path)
    try:
        data = load_config_file(path)
    except ConfigurationError as err:
        report = FileReport(name, ConfigKind.UNKNOWN)
        report.problems.extend(_problems_from_error(name, err))
        return report
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
    explicitly is always reported.
    """
    reports = []
    for path, explicit in expand(paths):
        report = validate_file(path, builtin=builtin)
        if (
            explicit
            or report.kind is not ConfigKind.UNKNOWN
            or any(p.rule != "kind" for p in report.problems)
        ):
            reports.append(report)
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
