"""Which requirements of the installed torch wheels belong to the torch family, and which are not met.

Run with the venv python after ``pip install --no-deps`` of the pinned torch (and torchaudio) from PyTorch's
index: prints JSON ``{"family": [...], "unsatisfied": [...]}``. ``family`` lists the requirements
(with their version specifiers, markers evaluated for this interpreter) whose name is one of the family
names given, e.g. ``pytorch-triton-rocm==3.5.1``; they are installed from PyTorch's index too.
``unsatisfied`` lists those of them that no installed distribution meets: none may remain before the rest
of torch's dependencies are installed from the node's own index, or pip would take a family member
(Triton) from there.

Usage: python mift_torch_family.py --dists torch torchaudio --family torch torchaudio ... triton
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import sys

try:
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name
except ImportError:  # a bare venv: pip's own copy
    from pip._vendor.packaging.requirements import InvalidRequirement, Requirement  # type: ignore[no-redef]
    from pip._vendor.packaging.utils import canonicalize_name  # type: ignore[no-redef]


def family_requirements(requires: list[str], family: set[str]) -> list[Requirement]:
    """The requirements among ``requires`` (Requires-Dist lines) that name a family member and apply here."""
    out: list[Requirement] = []
    for line in requires:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if canonicalize_name(req.name) not in family:
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        out.append(req)
    return out


def pin(req: Requirement) -> str:
    """Name and specifier, without the marker (already evaluated): ``pytorch-triton-rocm==3.5.1``."""
    return f"{req.name}{req.specifier}"


def installed_version(name: str) -> str | None:
    """The installed version of ``name``, None when it is not installed."""
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def unsatisfied(reqs: list[Requirement]) -> list[str]:
    """Requirement strings no installed distribution meets (missing, or another version)."""
    missing: list[str] = []
    for req in reqs:
        version = installed_version(req.name)
        if version is None or (req.specifier and not req.specifier.contains(version, prereleases=True)):
            missing.append(f"{pin(req)} (installed: {version or 'none'})")
    return missing


def main(argv: list[str] | None = None) -> int:
    """Print the family requirements of the given installed distributions as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--dists", nargs="+", required=True, help="installed distributions to read")
    parser.add_argument("--family", nargs="+", required=True, help="names that come from PyTorch's index")
    args = parser.parse_args(argv)
    family = {canonicalize_name(name) for name in args.family}
    reqs: list[Requirement] = []
    for dist in args.dists:
        try:
            requires = md.requires(dist) or []
        except md.PackageNotFoundError:
            print(json.dumps({"error": f"{dist} is not installed"}))
            return 1
        reqs.extend(r for r in family_requirements(requires, family) if pin(r) not in map(pin, reqs))
    print(json.dumps({"family": [pin(r) for r in reqs], "unsatisfied": unsatisfied(reqs)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
