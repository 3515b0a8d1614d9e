#!/usr/bin/env bash
# Issue 13's check on a host with several GPUs: the small study config/scaleout.yaml, first with
# --resources gpu=1, then with gpu=N (all GPUs of the host), each from empty results on the same
# data and with fresh memopt workers. Each run's results, logs and benchmarks go to
# $OUT/gpus<n>.tar.gz; tools/scaleout_report.py compares them here.
#
#   carry [".whl", ".corpus"]; command: MEMOPT_GIT_COMMIT=<sha> bash tools/gpu_scaleout.sh [N]
set -uo pipefail
OUT=${OUT:-/tmp/memopt-scaleout-out}
n=${1:-$(nvidia-smi -L | wc -l)}
export STUDY_CONFIG=${STUDY_CONFIG:-config/scaleout.yaml} STUDY_ONE_CALL=1 OUT
mkdir -p "$OUT"
for gpus in 1 "$n"; do
  export STUDY_GPUS=$gpus
  start=$SECONDS
  bash tools/gpu_study.sh start 600 || exit 1
  bash tools/gpu_study.sh wait $(( ${SCALEOUT_WAIT_S:-270} - (SECONDS - start) )) | tail -3
  pkill -f "memopt.run.worker" && sleep 2  # the next run starts its own workers, as a new run would
  echo "gpu=$gpus: $(( SECONDS - start )) s" | tee -a "$OUT/walls.txt"
  tar czf "$OUT/gpus$gpus.tar.gz" results logs .snakemake/log
  grep -q "^== piece finished" logs/study-run.log || { echo "gpu=$gpus: not finished in time"; exit 1; }
  rm -rf results logs .snakemake/metadata .snakemake/log paper/paper.* paper/figures
done
