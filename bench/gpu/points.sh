#!/bin/bash
# On the lent H200, from the root of the lead's checkout: the "Must show" H200 points of issues #27, #29, #31 and
# #28 in one device call (bench/gpu/points.py says what each measures). The call carries .devrun/ (this script,
# points.py, make_assets.py, the worktree's python/ package) and .whl/ (py-spy, peft, transformers' pins).
#   device: bash .devrun/points.sh        results: $OUT/*.log (at most 8 files come back)
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export POINTS_DROP_CACHES=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/points-out}
D=$PWD/.devrun
W=${POINTS_WORK:-/tmp/points}
mkdir -p "$OUT" "$W"
t0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  >"$OUT/pip.log" 2>&1 || { tail "$OUT/pip.log"; exit 1; }
export PYTHONPATH=/tmp/site:$D/python PATH=/tmp/site/bin:$PATH
el() { echo "[$(($(date +%s) - t0)) s] $*"; }
{
  date -u; nvidia-smi; nproc; free -g; df -h /tmp; uname -r
  python3 -c 'import torch, transformers, peft; print(torch.__version__, torch.version.cuda, transformers.__version__, peft.__version__)'
  py-spy --version
} >"$OUT/env.log" 2>&1
el "env done"

STEPS=" ${POINTS_STEPS:-check stacks train merge} "
# 29: the per-node GPU check; nvidia-smi before and after (memory used, compute processes)
[[ $STEPS == *" check "* ]] && {
  q() { nvidia-smi --query-gpu=memory.used --format=csv,noheader; nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader; }
  echo "--- before"; q
  echo "--- \$ python3 mift_gpu_check.py"
  s=$(date +%s%N)
  PYTHONPATH="$D/python" python3 -m launcher.node gpu-check; echo "rc $?"
  echo "process wall $(( ($(date +%s%N) - s) / 1000000 )) ms (interpreter start, torch import and CUDA init included)"
  echo "--- after"; q
  echo "--- \$ python3 mift_gpu_check.py (again)"
  PYTHONPATH="$D/python" python3 -m launcher.node gpu-check; echo "rc $?"
  echo "--- \$ python3 mift_gpu_check.py --min-tflops 2000 (a floor no H200 meets: the failing line)"
  PYTHONPATH="$D/python" python3 -m launcher.node gpu-check --min-tflops 2000; echo "rc $?"
  echo "--- after"; q
} >"$OUT/p29_check.log" 2>&1 && el "29 done"

# 27: stack dumps of stuck processes
if [[ $STEPS == *" stacks "* ]]; then
  timeout 120 python3 "$D/points.py" stacks --work "$W/stacks" >"$OUT/p27_stacks.log" 2>&1
  echo "rc $?" >>"$OUT/p27_stacks.log"
  el "27 stacks done"
fi

# 27 + 28: the sampler's cost on the 8B LoRA loop, then the checkpoint save/load
if [[ $STEPS == *" train "* ]]; then
  base=(--save-base); [[ -n ${POINTS_NO_BASE+set} ]] && base=()  # POINTS_NO_BASE set: no base model saved
  timeout "${POINTS_TRAIN_S:-330}" python3 "$D/points.py" train --work "$W/train" "${base[@]}" \
    --phase-s "${POINTS_PHASE_S:-30}" --phases "${POINTS_PHASES:-off,30,1,off,30,1}" >"$OUT/p27_p28_train.log" 2>&1
  echo "rc $?" >>"$OUT/p27_p28_train.log"
  el "train done"
fi

# 31: merge on the GPU, then on the CPU (each in a process of its own: its own peak; GNU time's maximum
# resident set size too where /usr/bin/time exists)
timev=(); [ -x /usr/bin/time ] && timev=(/usr/bin/time -v)
[[ $STEPS == *" merge "* ]] && for dev in cuda cpu; do
  limit=120; [ $dev = cpu ] && limit=150
  "${timev[@]}" timeout $limit python3 "$D/points.py" merge --device $dev --base "$W/train/base" \
    --adapter "$W/train/adapter" --out "$W/merged-$dev" >>"$OUT/p31_merge.log" 2>&1
  echo "rc $? ($dev)" >>"$OUT/p31_merge.log"
  rm -rf "$W/merged-$dev"
  el "merge $dev done"
done
grep -h "^RESULT" "$OUT"/*.log
el "all done"
