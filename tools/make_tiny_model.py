"""Create, offline and deterministically, a tiny random Llama model, its BPE tokenizer and the tiny dataset.

Usage:
    python tools/make_tiny_model.py OUT_DIR                 # model + tokenizer in OUT_DIR
    python tools/make_tiny_model.py --dataset-dir DIR       # only DIR/{tiny_alpaca.json,dataset_info.json}
    python tools/make_tiny_model.py OUT_DIR --dataset-dir DIR

The dataset is committed under ``configs/data/tiny_alpaca/`` (shipped to ``/opt/mift/data/tiny_alpaca/``);
the model is made at test time and shipped by ``train_configs_model_src`` to ``/opt/mift/models/tiny-llama``.
Adapted from the CPU lab's ``make_assets.py``. Needs torch, transformers and tokenizers for the model only.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from pathlib import Path
from typing import Any

SEED = 0
ROWS = 64
SUBJECTS = [
    "the cat",
    "a robot",
    "the river",
    "my friend",
    "the teacher",
    "a small bird",
    "the old ship",
    "our team",
]
VERBS = ["likes", "watches", "builds", "paints", "follows", "remembers", "carries", "finds"]
OBJECTS = [
    "the moon",
    "a red box",
    "green apples",
    "the long road",
    "a quiet song",
    "blue stones",
    "the north wind",
    "warm bread",
]
DATASET_NAME = "tiny_alpaca"
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>"]
CHAT_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] + '\\n' }}"
    "{% set loop_messages = messages[1:] %}"
    "{% else %}{% set loop_messages = messages %}{% endif %}"
    "{% for message in loop_messages %}{% if message['role'] == 'user' %}{{ 'Human: ' + message['content'] + "
    "'\\nAssistant:' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token + '\\n' }}"
    "{% endif %}{% endfor %}"
)


def tiny_alpaca_rows() -> list[dict[str, str]]:
    """Return the 64 alpaca rows (same seed, same rows, every time)."""
    rng = random.Random(SEED)  # noqa: S311 - reproducible sample data, not security
    rows = []
    for i in range(ROWS):
        s, v, o = rng.choice(SUBJECTS), rng.choice(VERBS), rng.choice(OBJECTS)
        kind = i % 4
        if kind == 0:
            rows.append(
                {
                    "instruction": f"Repeat the sentence: {s} {v} {o}.",
                    "input": "",
                    "output": f"{s.capitalize()} {v} {o}.",
                }
            )
        elif kind == 1:
            rows.append(
                {
                    "instruction": "Who is the subject of the sentence?",
                    "input": f"{s} {v} {o}.",
                    "output": f"The subject is {s}.",
                }
            )
        elif kind == 2:
            a, b = rng.randint(1, 20), rng.randint(1, 20)
            rows.append(
                {"instruction": f"What is {a} plus {b}?", "input": "", "output": f"{a} plus {b} is {a + b}."}
            )
        else:
            rows.append(
                {
                    "instruction": "Write the sentence in upper case.",
                    "input": f"{s} {v} {o}.",
                    "output": f"{s} {v} {o}.".upper(),
                }
            )
    return rows


def write_dataset(folder: Path) -> None:
    """Write ``tiny_alpaca.json`` and its ``dataset_info.json`` into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    info = {
        DATASET_NAME: {
            "file_name": f"{DATASET_NAME}.json",
            "columns": {"prompt": "instruction", "query": "input", "response": "output"},
        }
    }
    (folder / f"{DATASET_NAME}.json").write_text(
        json.dumps(tiny_alpaca_rows(), indent=1) + "\n", encoding="utf-8"
    )
    (folder / "dataset_info.json").write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")


def write_model(folder: Path) -> dict[str, Any]:
    """Train the tokenizer and save a random 2-layer Llama (fp32, safetensors) into ``folder``."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch  # noqa: PLC0415 - heavy, only for the model
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers  # noqa: PLC0415
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast  # noqa: PLC0415

    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(SEED)
    rows = tiny_alpaca_rows()
    corpus = [f"{r['instruction']} {r['input']} {r['output']}" for r in rows]
    corpus += [
        "Human: hello Assistant: hi there, how can I help you today?",
        "You are a helpful assistant. Answer the question below.",
        "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ 0123456789 .,:;!?'\"()[]{}<>-_/\\|@#$%^&*+=~`",
    ] * 4
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    # special token strings, not passwords
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",  # noqa: S106
        eos_token="</s>",  # noqa: S106
        unk_token="<unk>",  # noqa: S106
        pad_token="<pad>",  # noqa: S106
        model_max_length=256,
        padding_side="right",
    )
    hf_tok.chat_template = CHAT_TEMPLATE
    hf_tok.save_pretrained(folder)
    cfg = LlamaConfig(
        vocab_size=len(hf_tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        bos_token_id=hf_tok.bos_token_id,
        eos_token_id=hf_tok.eos_token_id,
        pad_token_id=hf_tok.pad_token_id,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(cfg).to(torch.float32)
    model.save_pretrained(folder, safe_serialization=True)
    return {"vocab": len(hf_tok), "params": sum(p.numel() for p in model.parameters()), "dir": str(folder)}


def main(argv: list[str] | None = None) -> int:
    """Parse arguments and write what was asked for."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", nargs="?", type=Path, help="model + tokenizer folder")
    parser.add_argument("--dataset-dir", type=Path, help="also write the tiny dataset here")
    args = parser.parse_args(argv)
    if args.out_dir is None and args.dataset_dir is None:
        parser.error("give OUT_DIR, --dataset-dir or both")
    if args.dataset_dir is not None:
        write_dataset(args.dataset_dir)
        sys.stdout.write(f"dataset: {args.dataset_dir}\n")
    if args.out_dir is not None:
        info = write_model(args.out_dir)
        sys.stdout.write(f"model: {info['dir']} ({info['params']} params, vocab {info['vocab']})\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
