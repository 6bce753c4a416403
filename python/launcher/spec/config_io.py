"""The one loader of every config the launcher reads: any path, any bytes, one line when it is not a config.

Files are read once, as bytes (:func:`read_config_bytes`: a directory, FIFO, socket, device, symlink loop,
unreadable or huge file is refused before anything is opened that could block), decoded as UTF-8, then parsed.
JSON and YAML are read the way their consumers do, and duplicate keys are refused. YAML is read with
OmegaConf's float rule (LLaMA-Factory loads its YAML through OmegaConf), so ``1e-4`` is a float here as it is
there, where plain PyYAML would read a string. Mapping keys must be strings (``yes:`` would be the boolean
True).
"""

from __future__ import annotations

import json
import re
import stat
from typing import TYPE_CHECKING, Any

import yaml

from launcher.exceptions import ConfigurationError

if TYPE_CHECKING:
    from pathlib import Path

# a job spec, training YAML or DeepSpeed JSON is a few KiB; anything this large is not one
MAX_CONFIG_BYTES = 8 * 1024 * 1024


def _file_error(path: Path, message: str, rule: str = "file") -> ConfigurationError:
    return ConfigurationError.at(path, "(file)", message, rule)


def read_config_bytes(path: Path, what: str = "config") -> bytes:
    """Return the bytes of the config file at ``path``; anything that is not a readable file raises.

    The type and size are checked with ``stat`` first, so a FIFO or device is never opened (that could block).
    """
    try:
        info = path.stat()
    except FileNotFoundError:
        raise _file_error(path, "no such file") from None
    except OSError as err:  # a symlink loop, a parent without search permission, a name too long
        raise _file_error(path, f"cannot read: {err.strerror or err}") from None
    if stat.S_ISDIR(info.st_mode):
        raise _file_error(path, f"is a directory, not a {what} file")
    if not stat.S_ISREG(info.st_mode):
        raise _file_error(path, f"not a regular file (a FIFO, socket or device), not a {what} file")
    if info.st_size > MAX_CONFIG_BYTES:
        raise _file_error(path, f"too large for a {what} ({info.st_size} bytes, limit {MAX_CONFIG_BYTES})")
    try:
        with path.open("rb") as fh:
            raw = fh.read(MAX_CONFIG_BYTES + 1)
    except OSError as err:
        raise _file_error(path, f"cannot read: {err.strerror or err}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise _file_error(path, f"too large for a {what} (more than {MAX_CONFIG_BYTES} bytes)")
    return raw


def decode_text(raw: bytes, path: Path) -> str:
    """Return ``raw`` as text; bytes that are not UTF-8 raise naming the first bad byte."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise _file_error(
            path, f"not UTF-8 text (byte 0x{raw[err.start]:02x} at offset {err.start})", "syntax"
        ) from None


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
            if not isinstance(key, str):
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is not a string (quote it)", key_node.start_mark
                )
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
        raise _file_error(path, f"not valid JSON: {err}", "syntax") from None
    except RecursionError:
        raise _file_error(path, "not valid JSON: nested too deeply", "syntax") from None


def load_yaml_text(text: str, path: Path) -> Any:  # noqa: ANN401 - any YAML value
    """Parse YAML text; a syntax error or duplicate key raises :class:`ConfigurationError`."""
    try:
        return yaml.load(text, Loader=_ConfigLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as err:
        where = f" (line {err.problem_mark.line + 1})" if err.problem_mark else ""
        raise _file_error(path, f"not valid YAML: {err.problem}{where}", "syntax") from None
    except yaml.YAMLError as err:
        raise _file_error(path, f"not valid YAML: {err}", "syntax") from None
    except RecursionError:
        raise _file_error(path, "not valid YAML: nested too deeply", "syntax") from None


def parse_config(raw: bytes, path: Path) -> Any:  # noqa: ANN401 - any JSON/YAML value
    """Parse the bytes of ``path`` as JSON (``.json``) or YAML (anything else)."""
    text = decode_text(raw, path)
    if path.suffix.lower() == ".json":
        return load_json_text(text, path)
    return load_yaml_text(text, path)


def load_config_file(path: Path, what: str = "config") -> Any:  # noqa: ANN401 - any JSON/YAML value
    """Read and parse ``path`` (:func:`read_config_bytes`, then :func:`parse_config`)."""
    return parse_config(read_config_bytes(path, what), path)
