#!/bin/bash
# On the GPU machine, from the repo root: install the carried wheels, then run bench/gpu_strategies.py.
# usage: bench/gpu/run.sh ARGS...   (arguments go to bench/gpu_strategies.py; results land in $OUT)
# The wheels land in /tmp/site (with console scripts in /tmp/site/bin): inventory/gpu-local's mift_node_venv.
set -u
. bench/gpu/env.sh
python3 bench/gpu_strategies.py "$@" 2>&1 | tee -a "$OUT/bench.log"
