#!/bin/bash
# On the lent GPU machine, from the repo root: issue #28's killed-and-recovered run next to an uninterrupted one
# (bench/gpu/recover.py says what it does). The device call carries .whl/ (bench/gpu/fetch_wheels.sh).
#   device: bash bench/gpu/recover.sh [recover.py options]      results: $OUT/recover.log
#   RECOVER_SHAPE=3b (default 8b): the model shape of make_assets.py, passed to recover.py as --shape too
set -u
. bench/gpu/env.sh
W=${RECOVER_WORK:-/tmp/recover}
mkdir -p "$W"
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c 'import torch, transformers, peft, deepspeed, llamafactory; print(torch.__version__, torch.version.cuda, transformers.__version__, peft.__version__, deepspeed.__version__, llamafactory.__version__)'; } >"$OUT/env.log" 2>&1
[[ -d $W/assets/model ]] || python3 bench/gpu/make_assets.py "$W/assets" "${RECOVER_SHAPE:-8b}" 96 >"$OUT/assets.log" 2>&1 || { tail "$OUT/assets.log"; exit 1; }
echo "[$(($(date +%s) - t0)) s] assets made"
python3 bench/gpu/recover.py "$W/assets" "$W/work" --shape "${RECOVER_SHAPE:-8b}" "$@" 2>&1 | tee "$OUT/recover.log"
rc=${PIPESTATUS[0]}
# at most 8 files come back: env, pip, assets, recover and each run's launcher.log and node trainer.log
for f in "$W"/work/*/launcher.log "$W"/work/*/trainer.log; do
  [[ -f $f ]] && cp "$f" "$OUT/$(basename "$(dirname "$f")")-$(basename "$f")"
done
echo "[$(($(date +%s) - t0)) s] rc $rc"
exit "$rc"
