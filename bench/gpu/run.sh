#!/bin/bash
# On the GPU machine, from the repo root: install the carried wheels, then run bench/gpu_strategies.py.
# usage: bench/gpu/run.sh ARGS...   (arguments go to bench/gpu_strategies.py; results land in $OUT)
# The wheels land in /tmp/site (with console scripts in /tmp/site/bin): inventory/gpu-local's mift_node_venv.
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export LANG=C.UTF-8 LC_ALL=C.UTF-8  # ansible (--launcher) refuses a non-UTF-8 locale
t0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  > "${OUT:-/tmp}/pip.log" 2>&1 || { tail "${OUT:-/tmp}/pip.log"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD/python PATH=/tmp/site/bin:$PATH
echo "wheels installed in $(( $(date +%s) - t0 ))s"
python3 bench/gpu_strategies.py "$@" 2>&1 | tee -a "${OUT:-/tmp}/bench.log"
