"""Write a PEP 503 "simple" index for a folder of wheels and sdists.

Usage: pep503.py FILES_DIR SIMPLE_DIR

SIMPLE_DIR is written next to FILES_DIR (links are ``../../<files dir name>/<file>#sha256=...``).
The index is built in a temporary folder and renamed into place, so a reader never sees a half index.
"""

from __future__ import annotations

import hashlib
import html
import re
import shutil
import sys
from pathlib import Path

_SDIST_SUFFIXES = (".tar.gz", ".zip")


def project_name(filename: str) -> str | None:
    """Return the PEP 503 normalised project name of a wheel or sdist file name, or None."""
    if filename.endswith(".whl"):
        name = filename.split("-", 1)[0]
    elif filename.endswith(_SDIST_SUFFIXES):
        stem = filename.removesuffix(".tar.gz").removesuffix(".zip")
        name = re.sub(r"-\d.*$", "", stem)
    else:
        return None
    return re.sub(r"[-_.]+", "-", name).lower()


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_index(files: Path, simple: Path) -> int:
    projects: dict[str, list[Path]] = {}
    for path in sorted(files.iterdir()):
        name = project_name(path.name)
        if name is not None and path.is_file():
            projects.setdefault(name, []).append(path)
    tmp = simple.with_name(simple.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    rel = f"../../{files.name}"
    top = ["<!DOCTYPE html><html><body>"]
    for name, paths in sorted(projects.items()):
        top.append(f'<a href="{name}/">{name}</a>')
        lines = ["<!DOCTYPE html><html><body>"]
        for path in paths:
            fn = html.escape(path.name)
            lines.append(f'<a href="{rel}/{fn}#sha256={sha256(path)}">{fn}</a>')
        lines.append("</body></html>")
        (tmp / name).mkdir()
        (tmp / name / "index.html").write_text("\n".join(lines) + "\n", encoding="utf-8")
    top.append("</body></html>")
    (tmp / "index.html").write_text("\n".join(top) + "\n", encoding="utf-8")
    old = simple.with_name(simple.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if simple.exists():
        simple.rename(old)
    tmp.rename(simple)
    shutil.rmtree(old, ignore_errors=True)
    return len(projects)


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: pep503.py FILES_DIR SIMPLE_DIR", file=sys.stderr)
        return 2
    files, simple = Path(argv[1]), Path(argv[2])
    if not files.is_dir():
        print(f"pep503.py: {files}: not a directory", file=sys.stderr)
        return 1
    count = write_index(files, simple)
    print(f"{count} projects indexed in {simple}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
