"""Parameter counts from config.json, checked against the numbers of the public Llama-3 model cards."""

from __future__ import annotations

import json

import pytest

from launcher.exceptions import ConfigurationError
from launcher.planning.model import (
    BUNDLED_DIR,
    LINEAR_MODULES,
    bundled_config_for,
    load_shape,
    shape_from_config,
)
from launcher.planning.training_yaml import base_workload

LLAMA3_70B = BUNDLED_DIR / "llama3_70b.json"


def test_llama3_70b_counts_match_the_model_card():
    m = load_shape(LLAMA3_70B)
    assert m.total_params() == 70_553_706_496  # 70.6 B, as published
    assert m.layer_params() == 855_654_400
    assert m.largest_module_params() == 1_050_673_152  # embedding / lm_head
    assert m.lora_params(8, LINEAR_MODULES) == 8 * 161_792 * 80


def test_llama3_8b_counts_match_the_model_card():
    assert load_shape(BUNDLED_DIR / "llama3_8b.json").total_params() == 8_030_261_248


def test_tied_embeddings_count_once_and_biases_add_vectors():
    base = {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 100,
    }
    untied = shape_from_config(base)
    tied = shape_from_config({**base, "tie_word_embeddings": True})
    biased = shape_from_config({**base, "attention_bias": True})
    assert untied.total_params() - tied.total_params() == 100 * 64
    assert biased.total_params() - untied.total_params() == 2 * (64 + 32 + 32)


def test_lora_targets_and_errors():
    m = load_shape(LLAMA3_70B)
    w = base_workload(m, {"lora_target": "q_proj,v_proj", "lora_rank": 16})
    assert w.trainable_params == 80 * 16 * ((8192 + 8192) + (8192 + 1024))
    assert base_workload(m, {"finetuning_type": "full"}).trainable_params == m.total_params()
    with pytest.raises(ConfigurationError, match="not a Llama linear module"):
        base_workload(m, {"lora_target": "qkv"})
    with pytest.raises(ConfigurationError, match="cutoff_len"):
        base_workload(m, {"cutoff_len": 0})


def test_bad_config_is_a_configuration_error(tmp_path):
    good = json.loads(LLAMA3_70B.read_text())
    (tmp_path / "config.json").write_text(json.dumps({**good, "hidden_size": "big"}))
    with pytest.raises(ConfigurationError, match="hidden_size"):
        load_shape(tmp_path)


def test_bundled_configs_are_found_by_model_name():
    assert bundled_config_for("meta-llama/Meta-Llama-3-70B-Instruct") == LLAMA3_70B
    assert bundled_config_for("meta-llama/Llama-3.1-70B") == LLAMA3_70B
    assert bundled_config_for("Qwen/Qwen3-4B") is None
