"""The pytorch role's ROCm -> torch map names only wheels recorded as existing, for every node interpreter.

The recorded list is requirements/rocm-torch-wheels.yml (each wheel with where it was seen; docs/stack.md
"Which wheels exist"); the node interpreters are the python_env role's own decision table
(plugins/module_utils/mift_python_choice.py: cp311 on Ubuntu 22.04 and Debian 12, cp312 on Ubuntu 24.04).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "plugins" / "module_utils"))

import mift_python_choice as choice  # noqa: E402

MAP = ROOT / "roles" / "pytorch" / "vars" / "main.yml"
KNOWN = ROOT / "requirements" / "rocm-torch-wheels.yml"


def node_tags() -> dict[str, list[str]]:
    """Interpreter tag -> the releases whose nodes get it, e.g. ``{'cp311': ['Ubuntu jammy', ...]}``."""
    tags: dict[str, list[str]] = {}
    for (distribution, release), pick in choice.CHOICES.items():
        tags.setdefault("cp" + pick.version.replace(".", ""), []).append(f"{distribution} {release}")
    return tags


def missing_wheels(releases: dict[str, dict[str, str]], known: dict[str, Any]) -> list[str]:
    """One line per map entry whose wheel is not recorded for an interpreter a node gets."""
    problems: list[str] = []
    not_published = {str(v) for v in known.get("torchaudio_not_published") or {}}
    for rocm, line in releases.items():
        torch = str(line["torch"])
        for dist in ("torch", "torchaudio"):
            version = str(line.get(dist, ""))
            if dist == "torchaudio" and not version:
                if torch.split("+", maxsplit=1)[0] not in not_published:
                    problems.append(
                        f'ROCm {rocm}: torchaudio "" but torchaudio {torch.split("+", maxsplit=1)[0]} is not '
                        f"recorded as unpublished in {KNOWN.name}"
                    )
                continue
            recorded = (known.get(dist) or {}).get(version) or {}
            for tag, oses in node_tags().items():
                if tag not in recorded:
                    problems.append(
                        f"ROCm {rocm}: {dist}-{version}-{tag} ({', '.join(oses)}) is not in {KNOWN.name}"
                    )
    return problems


def _load(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def test_every_map_line_names_wheels_that_exist_for_every_node_interpreter() -> None:
    releases = _load(MAP)["_pytorch_rocm_releases"]
    assert releases, "the map is empty"
    assert missing_wheels(releases, _load(KNOWN)) == []


def test_every_recorded_wheel_names_its_source() -> None:
    known = _load(KNOWN)
    for dist in ("torch", "torchaudio"):
        for version, tags in known[dist].items():
            assert "+rocm" in version, f"{dist} {version}: not a ROCm build"
            for tag, source in tags.items():
                assert tag.startswith("cp3"), f"{dist} {version}: {tag}"
                assert isinstance(source, str) and len(source) > 10, f"{dist} {version} {tag}: no source"


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        # the line the map held before (docs/stack.md): no cp311 wheel of 2.11.0+rocm7.2 was found
        (
            {"torch": "2.11.0+rocm7.2", "torchaudio": "2.11.0+rocm7.2"},
            [
                "ROCm 7.2: torch-2.11.0+rocm7.2-cp311 (Ubuntu jammy, Debian bookworm) is not in "
                "rocm-torch-wheels.yml",
                "ROCm 7.2: torchaudio-2.11.0+rocm7.2-cp311 (Ubuntu jammy, Debian bookworm) is not in "
                "rocm-torch-wheels.yml",
            ],
        ),
        # no torchaudio for a torch whose torchaudio was published: refused too
        (
            {"torch": "2.11.0+rocm7.2", "torchaudio": ""},
            [
                "ROCm 7.2: torch-2.11.0+rocm7.2-cp311 (Ubuntu jammy, Debian bookworm) is not in "
                "rocm-torch-wheels.yml",
                'ROCm 7.2: torchaudio "" but torchaudio 2.11.0 is not recorded as unpublished in '
                "rocm-torch-wheels.yml",
            ],
        ),
        ({"torch": "2.12.0+rocm7.2", "torchaudio": ""}, []),
    ],
)
def test_a_line_without_a_recorded_wheel_is_named(line: dict[str, str], expected: list[str]) -> None:
    assert missing_wheels({"7.2": line}, _load(KNOWN)) == expected
