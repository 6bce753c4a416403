"""Map the node paths written in shipped configs to the controller copies they are made from.

The ``train_configs`` role copies ``configs/deepspeed/`` and ``configs/train/`` to
``/opt/mift/configs/{deepspeed,train}/`` and ``configs/data/<name>/`` to ``/opt/mift/data/<name>/``,
rewriting nothing. A training YAML in ``configs/train/`` therefore names its DeepSpeed file as
``/opt/mift/configs/deepspeed/x.json``; on the controller that is ``configs/deepspeed/x.json``, found from
the YAML's own location (its folder's parent is the config root).
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

NODE_CONFIGS = PurePosixPath("/opt/mift/configs")
NODE_DATA = PurePosixPath("/opt/mift/data")
NODE_LAYOUT_DIRS = ("train", "deepspeed")


def display(path: Path) -> str:
    """Return ``path`` relative to the working directory when it is below it, else absolute."""
    resolved = path.resolve()
    try:
        return str(resolved.relative_to(Path.cwd()))
    except ValueError:
        return str(resolved)


def config_root_for(yaml_path: Path) -> Path | None:
    """Return the controller config root (``configs/``) of a YAML in ``configs/train/``, else None."""
    parent = yaml_path.resolve().parent
    return parent.parent if parent.name in NODE_LAYOUT_DIRS else None


def to_controller(node_path: str, config_root: Path | None) -> Path | None:
    """Return the controller copy of a ``/opt/mift/{configs,data}/...`` path, or None when not one.

    Args:
        node_path: The path as written in the config.
        config_root: The controller folder that mirrors ``/opt/mift/configs`` (its ``data/`` mirrors
            ``/opt/mift/data``).
    """
    pure = PurePosixPath(node_path)
    if config_root is None:
        return None
    if pure.is_relative_to(NODE_CONFIGS):
        return config_root.joinpath(*pure.relative_to(NODE_CONFIGS).parts)
    if pure.is_relative_to(NODE_DATA):
        return config_root.joinpath("data", *pure.relative_to(NODE_DATA).parts)
    return None


def is_node_path(value: str) -> bool:
    """Return True for paths under ``/opt/mift/configs`` or ``/opt/mift/data``."""
    pure = PurePosixPath(value)
    return pure.is_relative_to(NODE_CONFIGS) or pure.is_relative_to(NODE_DATA)


def resolve_referenced(  # noqa: PLR0911 - one return per kind of path
    value: str, yaml_path: Path, config_root: Path | None
) -> tuple[Path | None, str]:
    """Find the controller file a training YAML refers to (``deepspeed:``).

    Order: a ``/opt/mift/...`` node path maps to its controller copy (or is taken as is when it exists
    here, e.g. when validating on a node); another absolute path must exist here; a relative path is
    looked up from the YAML's folder and then each folder above it (LLaMA-Factory opens it from the
    working directory, which for its own examples is the repository root).

    Returns:
        The file found (or None) and, when None, why.
    """
    if value.startswith("/"):
        if Path(value).is_file():
            return Path(value), ""
        if is_node_path(value):
            local = to_controller(value, config_root)
            if local is None:
                return None, (
                    f"{value}: node path, and this YAML is not in a configs/train/ folder whose parent "
                    "mirrors /opt/mift/configs"
                )
            if local.is_file():
                return Path(display(local)), ""
            return None, f"{value}: no such file (looked for its controller copy {display(local)})"
        return None, f"{value}: no such file on the controller; ship it under {NODE_CONFIGS}/deepspeed/"
    base = yaml_path.resolve().parent
    for folder in (base, *base.parents):
        candidate = folder / value
        if candidate.is_file():
            return Path(display(candidate)), ""
    return None, f"{value}: no such file relative to {base} or any folder above it"
