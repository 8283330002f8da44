#!/usr/bin/env bash
# Session 39, call D: the option and variant files outside the grids (tests/gpu_grids.sh
# PARTS=extra: block-sparse causal / options / pack_gqa / split-KV, the dQ-writer,
# deterministic-writer, dqalias / dqearly files, HSTU D = 256 and the fuzz tests), one process
# per group, each under the limit T.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT T=240 bash scripts/sessions/gpu_s39_d.sh
set -u
export LOGS=/tmp/gg_logs_d
OUT=$OUT/s39d PARTS=extra T=${T:-240} bash tests/gpu_grids.sh
