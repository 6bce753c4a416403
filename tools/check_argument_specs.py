"""Check that every role documents exactly its defaults in meta/argument_specs.yml.

For each role under roles/: every key of defaults/main.yml must be an option of the ``main`` entry
point, and every option with a ``default`` in the spec must be in defaults/main.yml with the same value.
Every public variable is prefixed with the role name. Prints one line per problem; exit 1 if any.
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

ROLES = Path(__file__).resolve().parent.parent / "roles"


def _load(path: Path) -> dict[str, object]:
    if not path.is_file():
        return {}
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    if not isinstance(data, dict):
        raise SystemExit(f"{path}: expected a mapping at the top level")
    return data


def check_role(role: Path) -> list[str]:
    """Return the problems found in one role."""
    problems: list[str] = []
    spec_path = role / "meta" / "argument_specs.yml"
    if not spec_path.is_file():
        return [f"{spec_path}: missing"]
    specs = _load(spec_path).get("argument_specs")
    if not isinstance(specs, dict) or "main" not in specs:
        return [f"{spec_path}: argument_specs.main: missing"]
    options = specs["main"].get("options") or {}
    defaults = _load(role / "defaults" / "main.yml")
    prefix = f"{role.name}_"
    for key in defaults:
        if not key.startswith(prefix):
            problems.append(f"{role / 'defaults/main.yml'}: {key}: not prefixed with {prefix!r}")
        if key not in options:
            problems.append(f"{spec_path}: {key}: in defaults but not documented in the argument spec")
    for key, option in options.items():
        if not key.startswith(prefix):
            problems.append(f"{spec_path}: {key}: not prefixed with {prefix!r}")
        if not isinstance(option, dict) or "description" not in option:
            problems.append(f"{spec_path}: {key}: no description")
            continue
        if "default" in option and key in defaults and option["default"] != defaults[key]:
            spec_default, real_default = option["default"], defaults[key]
            problems.append(f"{spec_path}: {key}: spec default {spec_default!r} != defaults {real_default!r}")
        if not option.get("required") and key not in defaults:
            problems.append(f"{spec_path}: {key}: optional but has no value in defaults/main.yml")
    return problems


def main() -> int:
    """Check every role; print problems; return the exit code."""
    problems = [p for role in sorted(ROLES.iterdir()) if role.is_dir() for p in check_role(role)]
    for line in problems:
        print(line)
    count = len([r for r in ROLES.iterdir() if r.is_dir()])
    print(f"argument specs: {count} roles checked, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
