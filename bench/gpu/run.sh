#!/usr/bin/env bash
# GPU benchmark entry point: builds the shim, makes the checkout's agent
# importable without installing it, and runs bench/gpu/run.py.
#   bench/gpu/run.sh [RESULTS_DIR]
#   bench/gpu/run.sh --against-original ORIGINAL_BUILD [RESULTS_DIR]   (original.py)
#   bench/gpu/run.sh --jax-allocators [RESULTS_DIR]                    (jax_allocators.py)
#   bench/gpu/run.sh --launch-pairs [PAIRS] [RESULTS_DIR]              (launch_pairs.py)
#   bench/gpu/run.sh --launch-spread [PROCESSES] [RESULTS_DIR]         (launch_spread.py)
#   bench/gpu/run.sh --hook-cost [PROCESSES] [RESULTS_DIR]             (hook_cost.py)
#   bench/gpu/run.sh --prefetch-split [RESULTS_DIR] [OPTIONS]          (prefetch_split.py)
#   bench/gpu/run.sh --startup [PAIRS] [RESULTS_DIR]                   (startup.py)
#   bench/gpu/run.sh --liveness [RESULTS_DIR]                          (liveness.py)
#   bench/gpu/run.sh --multi-gpu [RESULTS_DIR]                         (multi_gpu.py)
#   bench/gpu/run.sh --mix [RESULTS_DIR] [--window S]                  (mix.py)
#   bench/gpu/run.sh --shares [RESULTS_DIR] [--window S]               (shares.py, as root)
#   bench/gpu/run.sh --duty [RESULTS_DIR] [--window S] [--only PARTS]  (duty.py)
#   bench/gpu/run.sh --busy-turns [RESULTS_DIR] [--seconds S] [--pairs N] (busy_turns.py)
#   bench/gpu/run.sh --meter-check [RESULTS_DIR] [--seconds S]         (meter_check.py)
#   bench/gpu/run.sh --hold-ceiling [RESULTS_DIR] [--window S]         (hold_ceiling.py)
#   bench/gpu/run.sh --idle-probe [RESULTS_DIR]                        (idle_probe.py)
#   bench/gpu/run.sh --side-by-side [RESULTS_DIR] [--window S]         (side_by_side.py, as root)
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
make -s -C "$repo/shim"
# pyproject maps the folder agent/ to the package nvshare_agent; a symlink with
# the package's name does the same for a checkout that is not installed.
pypath=$(mktemp -d)
ln -s "$repo/agent" "$pypath/nvshare_agent"
export PYTHONPATH="$pypath${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
script=run.py
case "${1:-}" in
    --against-original) script=original.py; shift ;;
    --jax-allocators) script=jax_allocators.py; shift ;;
    --launch-pairs) script=launch_pairs.py; shift ;;
    --launch-spread) script=launch_spread.py; shift ;;
    --hook-cost) script=hook_cost.py; shift ;;
    --prefetch-split) script=prefetch_split.py; shift ;;
    --startup) script=startup.py; shift ;;
    --liveness) script=liveness.py; shift ;;
    --multi-gpu) script=multi_gpu.py; shift ;;
    --mix) script=mix.py; shift ;;
    --drain-probe) script=drain_probe.py; shift ;;
    --shares) script=shares.py; shift ;;
    --duty) script=duty.py; shift ;;
    --busy-turns) script=busy_turns.py; shift ;;
    --meter-check) script=meter_check.py; shift ;;
    --hold-ceiling) script=hold_ceiling.py; shift ;;
    --idle-probe) script=idle_probe.py; shift ;;
    --side-by-side) script=side_by_side.py; shift ;;
esac
exec python3 "$repo/bench/gpu/$script" "$@"
