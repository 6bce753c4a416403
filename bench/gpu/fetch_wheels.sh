#!/bin/bash
# Here (the controller, which reaches PyPI): fill .whl/ with the wheels the lent GPU machine lacks, for its
# python3.12 (it has torch 2.11.0+cu130, triton, tokenizers, peft, accelerate, huggingface_hub, jinja2, PyYAML but
# no DeepSpeed, LLaMA-Factory, datasets, trl, liger-kernel or Ansible, and no network). The device tool carries
# .whl/ (`carry: [".whl"]`); bench/gpu/run.sh and run_grid.sh install it there with --no-index --no-deps.
# The list is /work/shared/reference/gpu-lab/README.md's, plus the launcher's Ansible and liger-kernel.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
mkdir -p .whl
WHEELS=(
  llamafactory==0.9.5 transformers==5.6.0 tokenizers==0.22.2 datasets==4.0.0 trl==0.24.0 peft==0.18.1
  accelerate==1.11.0 tyro==0.8.14 docstring-parser shtab typeguard fire termcolor omegaconf antlr4-python3-runtime
  dill==0.3.8 multiprocess==0.70.16 hjson pydantic pydantic-core annotated-types typing-inspection
  typing-extensions regex torchdata==0.11.0 fsspec==2025.3.0 liger-kernel==0.8.5
  ansible-core==2.19.14 resolvelib==1.2.1 ansible-runner==2.4.3 pexpect ptyprocess python-daemon lockfile
  cryptography cffi pycparser
)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --abi cp312 --abi abi3 --abi none -d .whl "${WHEELS[@]}"
# DeepSpeed ships an sdist only: a pure-Python wheel with no ops built (the H200 JIT-compiles what it uses)
if ! ls .whl/deepspeed-0.19.8-*.whl >/dev/null 2>&1; then
  build=$(mktemp -d)
  trap 'rm -rf "$build"' EXIT
  python3 -m venv "$build/venv"
  "$build/venv/bin/pip" install -q wheel setuptools
  "$build/venv/bin/pip" download -q --no-deps --no-binary=:all: deepspeed==0.19.8 -d "$build"
  tar xzf "$build"/deepspeed-0.19.8.tar.gz -C "$build"
  (cd "$build/deepspeed-0.19.8" && DS_BUILD_OPS=0 "$build/venv/bin/pip" wheel -q --no-deps --no-build-isolation . -w "$OLDPWD/.whl")
fi
du -sh .whl
