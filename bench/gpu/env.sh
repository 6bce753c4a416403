# shellcheck shell=bash
# Sourced by the device scripts (run.sh, recover.sh), from the repo root on the GPU machine: the environment of
# every bench run and the carried wheels (.whl/, bench/gpu/fetch_wheels.sh) installed in /tmp/site, which is
# inventory/gpu-local's mift_node_venv. $OUT (the device tool's result folder) gets pip.log.
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export LANG=C.UTF-8 LC_ALL=C.UTF-8 # ansible (the launcher) refuses a non-UTF-8 locale
OUT=${OUT:-/tmp/bench-out}
mkdir -p "$OUT"
t0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  >"$OUT/pip.log" 2>&1 || { tail "$OUT/pip.log"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD/python PATH=/tmp/site/bin:$PATH
echo "wheels installed in $(($(date +%s) - t0)) s"
