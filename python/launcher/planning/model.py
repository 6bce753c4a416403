"""Parameter counts of a Llama-style decoder from its Hugging Face ``config.json``.

Counts are exact for Llama / Mistral / Qwen2-style models without biases (embeddings, attention with grouped
KV heads, gated MLP, RMSNorm weights, lm_head tied or not); a config with ``attention_bias`` or ``mlp_bias``
adds the bias vectors.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.exceptions import ConfigurationError

# The seven linear projections of a Llama decoder layer, as LLaMA-Factory's ``lora_target: all`` finds them.
LINEAR_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
BUNDLED_DIR = Path(__file__).resolve().parent.parent / "data" / "model_configs"
# model_name_or_path patterns that map to a bundled config (public model cards; no weights needed)
BUNDLED = (
    (re.compile(r"llama-?3(\.[0-9])?-70b", re.IGNORECASE), "llama3_70b.json"),
    (re.compile(r"llama-?3(\.[0-9])?-8b", re.IGNORECASE), "llama3_8b.json"),
)


@dataclass(frozen=True)
class ModelShape:
    """The numbers of a decoder-only transformer that memory depends on."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    tied_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False

    @property
    def head_dim(self) -> int:
        """Return the width of one attention head."""
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        """Return the output width of k_proj / v_proj (grouped-query attention)."""
        return self.kv_heads * self.head_dim

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """Return ``{module: (in_features, out_features)}`` of one layer's linear projections."""
        h, i, kv = self.hidden, self.intermediate, self.kv_dim
        return {
            "q_proj": (h, h),
            "k_proj": (h, kv),
            "v_proj": (h, kv),
            "o_proj": (h, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }

    def layer_params(self) -> int:
        """Return the parameters of one decoder layer (projections, biases, two RMSNorm weights)."""
        shapes = self.linear_shapes()
        total = sum(a * b for a, b in shapes.values()) + 2 * self.hidden
        if self.attention_bias:
            total += sum(shapes[m][1] for m in ("q_proj", "k_proj", "v_proj"))
        if self.mlp_bias:
            total += sum(shapes[m][1] for m in ("gate_proj", "up_proj", "down_proj"))
        return total

    @property
    def embedding_params(self) -> int:
        """Return the parameters of the token embedding (and of an untied lm_head, each)."""
        return self.vocab * self.hidden

    def total_params(self) -> int:
        """Return all parameters, counting a tied lm_head once."""
        heads = 1 if self.tied_embeddings else 2
        return self.layers * self.layer_params() + heads * self.embedding_params + self.hidden

    def largest_module_params(self) -> int:
        """Return the largest single module's parameters (what ZeRO-3 gathers at once)."""
        biggest_linear = max(a * b for a, b in self.linear_shapes().values())
        return max(self.embedding_params, biggest_linear)

    def lora_params(self, rank: int, targets: tuple[str, ...]) -> int:
        """Return LoRA's trainable parameters: ``rank * (in + out)`` per targeted projection and layer."""
        shapes = self.linear_shapes()
        unknown = [t for t in targets if t not in shapes]
        if unknown:
            raise ConfigurationError(
                f"lora_target: {', '.join(unknown)}: not a Llama linear module ({', '.join(LINEAR_MODULES)})"
            )
        return self.layers * sum(rank * (shapes[t][0] + shapes[t][1]) for t in targets)


def _int(config: dict[str, Any], key: str, source: str) -> int:
    value = config.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigurationError(f"{source}: {key}: expected a positive integer, got {value!r}")
    return value


def shape_from_config(config: dict[str, Any], source: str = "config.json") -> ModelShape:
    """Build a :class:`ModelShape` from a parsed Hugging Face ``config.json``."""
    if "text_config" in config and "hidden_size" not in config:  # multimodal wrappers keep the LM inside
        config = config["text_config"]
    heads = _int(config, "num_attention_heads", source)
    return ModelShape(
        hidden=_int(config, "hidden_size", source),
        intermediate=_int(config, "intermediate_size", source),
        layers=_int(config, "num_hidden_layers", source),
        heads=heads,
        kv_heads=int(config.get("num_key_value_heads") or heads),
        vocab=_int(config, "vocab_size", source),
        tied_embeddings=bool(config.get("tie_word_embeddings", False)),
        attention_bias=bool(config.get("attention_bias", False)),
        mlp_bias=bool(config.get("mlp_bias", False)),
    )


def load_shape(path: Path) -> ModelShape:
    """Read ``config.json`` (a file, or a model folder holding one)."""
    file = path / "config.json" if path.is_dir() else path
    try:
        data = json.loads(file.read_text())
    except OSError as err:
        raise ConfigurationError(f"{file}: cannot read model config: {err.strerror}") from None
    except json.JSONDecodeError as err:
        raise ConfigurationError(f"{file}: not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise ConfigurationError(f"{file}: a model config must be a JSON object")
    return shape_from_config(data, str(file))


def bundled_config_for(model_name_or_path: str) -> Path | None:
    """Return the bundled config whose pattern matches a model name (e.g. ``meta-llama/Meta-Llama-3-70B``)."""
    for pattern, name in BUNDLED:
        if pattern.search(model_name_or_path):
            return BUNDLED_DIR / name
    return None


def resolve_shape(model_dir_or_config: str | Path | None, train: dict[str, Any]) -> ModelShape:
    """Find the model's config.json: the given path, ``model_name_or_path`` if local, or a bundled config."""
    name = str(model_dir_or_config or train.get("model_name_or_path") or "")
    if name and Path(name).exists():
        return load_shape(Path(name))
    bundled = bundled_config_for(name)  # a node path or hub name not present here, e.g. .../Meta-Llama-3-70B
    if bundled is not None:
        return load_shape(bundled)
    raise ConfigurationError(
        f"model_name_or_path: {name or '(missing)'}: no config.json on this machine; pass --model-config "
        "(launcher plan) or set plan_model_config in the job spec"
    )
