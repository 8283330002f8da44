#!/usr/bin/env bash
# Session 39, call C: the final validation of the tree (tests/gpu_final.sh: the quiet-GPU
# benchmarks, then the HSTU, block-sparse and rab grids, the transformation tests and the garbage-metadata grid under
# compute-sanitizer), with per-process limits that fit one device call.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/sessions/gpu_s39_c.sh
set -u
export LOGS=/tmp/gg_logs_c
OUT=$OUT/s39c PARTS="hstu bsa rab transforms sanitize" T=${T:-290} SAN_T=${SAN_T:-170} bash tests/gpu_final.sh
