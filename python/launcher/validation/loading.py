"""Read JSON and YAML config files the way their consumers do, and reject duplicate keys.

YAML is read with OmegaConf's float rule (LLaMA-Factory loads its YAML through OmegaConf), so ``1e-4``
is a float here as it is there, where plain PyYAML would read a string.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

import yaml

from launcher.exceptions import ConfigurationError

if TYPE_CHECKING:
    from pathlib import Path

# Same expression as omegaconf._utils.get_yaml_loader (YAML 1.2 floats, exponent without a dot).
_FLOAT_RE = re.compile(
    r"""^(?:
     [-+]?[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?[0-9][0-9_]*(?:[eE][-+]?[0-9]+)
    |\.[0-9_]+(?:[eE][-+][0-9]+)?
    |[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
    re.VERBOSE,
)


class _ConfigLoader(yaml.SafeLoader):
    """Safe loader with OmegaConf floats that refuses duplicate mapping keys."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        """Build a mapping, raising on a key seen twice."""
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


_ConfigLoader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_RE, list("-+0123456789."))


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def load_json_text(text: str, path: Path) -> Any:  # noqa: ANN401 - any JSON value
    """Parse JSON text; a syntax error or duplicate key raises :class:`ConfigurationError`."""
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates)
    except ValueError as err:
        raise ConfigurationError(f"{path}: (file): not valid JSON: {err}") from None


def load_yaml_text(text: str, path: Path) -> Any:  # noqa: ANN401 - any YAML value
    """Parse YAML text; a syntax error or duplicate key raises :class:`ConfigurationError`."""
    try:
        return yaml.load(text, Loader=_ConfigLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as err:
        where = f" (line {err.problem_mark.line + 1})" if err.problem_mark else ""
        raise ConfigurationError(f"{path}: (file): not valid YAML: {err.problem}{where}") from None
    except yaml.YAMLError as err:
        raise ConfigurationError(f"{path}: (file): not valid YAML: {' '.join(str(err).split())}") from None


def load_config_file(path: Path) -> Any:  # noqa: ANN401 - any JSON/YAML value
    """Read ``path`` as JSON (``.json``) or YAML (anything else)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigurationError(f"{path}: (file): cannot read: {err.strerror}") from None
    if path.suffix.lower() == ".json":
        return load_json_text(text, path)
    return load_yaml_text(text, path)
