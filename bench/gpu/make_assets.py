"""Make a random-init Llama of a given shape (bf16, offline), a BPE tokenizer and a synthetic SFT dataset.

Usage: make_assets.py OUT_DIR SHAPE [SAMPLES]. Every sample is longer than cutoff_len 1024 so every
micro-batch holds exactly cutoff_len tokens (the planner's worst case).
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

SHAPES = {
    "tiny": {
        "hidden_size": 256,
        "intermediate_size": 688,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    },
    "3b": {
        "hidden_size": 3072,
        "intermediate_size": 8192,
        "num_hidden_layers": 28,
        "num_attention_heads": 24,
        "num_key_value_heads": 8,
    },
    "8b": {
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
    },
}


def main() -> None:
    # heavy imports here: bench/gpu_strategies.py imports SHAPES without torch (--dry-run on a CPU machine)
    import torch  # noqa: PLC0415
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: PLC0415
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast  # noqa: PLC0415

    out, shape = Path(sys.argv[1]), sys.argv[2]
    samples = int(sys.argv[3]) if len(sys.argv) > 3 else 64
    rng = random.Random(0)
    words = [
        "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 8)))
        for _ in range(3000)
    ]
    corpus = [" ".join(rng.choice(words) for _ in range(60)) for _ in range(2000)]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        corpus, trainers.BpeTrainer(vocab_size=4000, special_tokens=["<unk>", "<s>", "</s>", "<pad>"])
    )
    t = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )
    mdir = out / "model"
    t.save_pretrained(mdir)
    cfg = LlamaConfig(
        vocab_size=len(t),
        max_position_embeddings=4096,
        rope_theta=500000.0,
        torch_dtype="bfloat16",
        tie_word_embeddings=False,
        bos_token_id=t.bos_token_id,
        eos_token_id=t.eos_token_id,
        pad_token_id=t.pad_token_id,
        **SHAPES[shape],
    )
    t0 = time.time()
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(mdir, safe_serialization=True)
    n = sum(p.numel() for p in model.parameters())
    print(f"model {shape}: {n / 1e9:.3f} B params, made+saved in {time.time() - t0:.1f}s", flush=True)
    ddir = out / "data"
    ddir.mkdir(parents=True, exist_ok=True)
    rows = [
        {
            "instruction": " ".join(rng.choice(words) for _ in range(40)),
            "input": "",
            "output": " ".join(rng.choice(words) for _ in range(1400)),
        }
        for _ in range(samples)
    ]
    (ddir / "synth.json").write_text(json.dumps(rows))
    (ddir / "dataset_info.json").write_text(json.dumps({"synth": {"file_name": "synth.json"}}))


if __name__ == "__main__":
    main()
