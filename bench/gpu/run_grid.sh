#!/bin/bash
# On the GPU machine, from the repo root: install the carried wheels, then run bench/gpu/plan_grid.py.
# usage: bench/gpu/run_grid.sh SHAPE CONFIG... [--steps N --deadline-s S]   (results land in $OUT)
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export LANG=C.UTF-8 LC_ALL=C.UTF-8  # ansible (--launcher) refuses a non-UTF-8 locale
t0=$(date +%s)
if [ ! -d /tmp/site/llamafactory ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    > "${OUT:-/tmp}/pip.log" 2>&1 || { tail "${OUT:-/tmp}/pip.log"; exit 1; }
fi
export PYTHONPATH=/tmp/site:$PWD/python PATH=/tmp/site/bin:$PATH
echo "wheels installed in $(( $(date +%s) - t0 ))s"
python3 bench/gpu/plan_grid.py "$@" 2>&1 | tee -a "${OUT:-/tmp}/grid_$1.log"
