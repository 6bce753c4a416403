#!/bin/bash
# On the lent GPU machine, from the root of the lead's checkout (the device tool's working tree): the GPU path of
# `launcher check` on one node (issue #42), then the planner reading what it measured. It runs in the device's
# copy of the checkout; the call carries .fabric-dev/whl/ (Ansible, ansible-runner, pydantic and their needs).
#   device: bash bench/gpu/fabric_check.sh   (carry [".fabric-dev"])    results: $OUT/*.log, $OUT/*.json
set -u
D=$PWD/.fabric-dev
OUT=${OUT:-/tmp/fabric-out}
export PYTHONUNBUFFERED=1 LANG=C.UTF-8 LC_ALL=C.UTF-8 MIFT_CHECK_CACHE=/tmp/fabric-cache
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p "$OUT"
t0=$(date +%s)
el() { echo "[$(($(date +%s) - t0)) s] $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$D"/whl/*.whl \
  >"$OUT/pip.log" 2>&1 || { tail "$OUT/pip.log"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD/python PATH=/tmp/site/bin:$PATH
PY=$(command -v python3)
# STAND-IN of LLaMA-Factory's entry point: preflight looks for it (a check starts no trainer); its shebang names
# the machine's torch interpreter, which preflight's torch probe and the check's node scripts then use
printf '#!%s\n"""STAND-IN llamafactory-cli (launcher check trains nothing)."""\n' "$PY" >/tmp/site/bin/llamafactory-cli
chmod +x /tmp/site/bin/llamafactory-cli
{
  date -u; nvidia-smi; nproc; uname -r
  "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), "gpus", torch.cuda.device_count())'
  for t in all_reduce_perf ib_write_bw; do echo "$t: $(command -v $t || echo 'not on this machine')"; done
  ls /sys/class/infiniband 2>&1
} >"$OUT/env.log" 2>&1
el "env done"
# 1. the node script alone (what the check's playbook feeds to the node), the full sweep 1 MiB .. 1 GiB
SPEC='{"addrs": {"gpu-local": "127.0.0.1"}, "rounds": [], "intra_port": 29799, "iters": 20, "warmup": 5, "timeout_s": 300, "tools": {"all_reduce_perf": true}}'
s=$(date +%s%N)
PYTHONPATH=$PWD/python "$PY" -m launcher.node gpu-allreduce "$SPEC" gpu-local >"$OUT/node_script.json" 2>"$OUT/node_script.err"
echo "rc $? wall $(( ($(date +%s%N) - s) / 1000000 )) ms" >>"$OUT/node_script.err"
el "node script done"
# 2. launcher check through the launcher (--fabric auto: the GPU test's answer picks the GPU path), then again
#    (the cache of this boot)
{
  echo "\$ python -m launcher check bench/gpu/fabric_job.yaml -i inventory/gpu-local --fresh"
  s=$(date +%s)
  "$PY" -m launcher check bench/gpu/fabric_job.yaml -i inventory/gpu-local --fresh; echo "rc $? ($(( $(date +%s) - s )) s)"
  echo; echo "\$ python -m launcher check bench/gpu/fabric_job.yaml -i inventory/gpu-local   (again: the cache)"
  "$PY" -m launcher check bench/gpu/fabric_job.yaml -i inventory/gpu-local; echo "rc $?"
} >"$OUT/check.log" 2>&1
el "check done"
# 3. the planner reading the check's record
"$PY" bench/gpu/fabric_planner.py >"$OUT/planner.log" 2>&1; echo "rc $?" >>"$OUT/planner.log"
el "planner done"
cp -r "$MIFT_CHECK_CACHE" "$OUT/cache" 2>/dev/null
