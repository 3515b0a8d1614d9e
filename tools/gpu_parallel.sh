#!/usr/bin/env bash
# Issue 17's check on a host with 2 GPUs: config/parallel.yaml (the default model in BF16 on one
# GPU, and on two with ddp, ZeRO-1, ZeRO-2 and ZeRO-3) with --resources gpu=2, from empty results.
# Results, logs and the paper go to $OUT/parallel.tar.gz; tools/parallel_report.py tabulates them.
#
#   carry [".whl", ".corpus"]; command: MEMOPT_GIT_COMMIT=<sha> bash tools/gpu_parallel.sh
set -uo pipefail
OUT=${OUT:-/tmp/memopt-parallel-out}
export STUDY_CONFIG=config/parallel.yaml STUDY_ONE_CALL=1 STUDY_GPUS=2 OUT
mkdir -p "$OUT"
nvidia-smi -L
start=$SECONDS
bash tools/gpu_study.sh start 560 || exit 1
bash tools/gpu_study.sh wait $(( ${PARALLEL_WAIT_S:-540} - (SECONDS - start) )) | tail -5
echo "wall: $(( SECONDS - start )) s" | tee "$OUT/wall.txt"
tar czf "$OUT/parallel.tar.gz" results logs .snakemake/log paper/paper.md 2>/dev/null
grep -q "^== piece finished" logs/study-run.log || { echo "not finished in time"; tail -30 logs/study-run.log; exit 1; }
