#!/usr/bin/env bash
# GPU verification: the GPU test suite (tests; GPU_TESTS picks files and -k), the technique
# benchmark of the default model (bench; BENCH_ARGS picks techniques and batches, default: all at
# batch 16), the batch-size search benchmark and checks (search), the smoke study end to end on
# CUDA through Snakemake (smoke); on request only, the exactness noise floor (floor:
# tools/bench_floor.py on the default study's data, for exactness.floor_factor; plan: memopt plan
# against real searches at a configuration no study measured).
# Everything worth keeping goes under $OUT (the device tool brings it back).
#
# On the device machine (see the device tool's README), from the repository root:
#   carry [".whl", ".corpus"]; command: bash tools/gpu_check.sh [tests] [bench] [search] [smoke]
# (no argument: all four; one call of the device tool has 10 minutes: split them).
# .whl holds wheels the GPU image lacks (../shared/hooks/device-wheels.sh makes it); .corpus a copy
# of the speakleash mirror (speakleash.json + eltec_pol_mini.*).
set -uo pipefail
OUT=${OUT:-/tmp/memopt-gpu-check}
MIRROR=${MIRROR:-$PWD/.corpus}
DATASET=${DATASET:-eltec_pol_mini}
mkdir -p "$OUT"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
fi
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
{ nvidia-smi; python3 -c 'import torch, sys; print(sys.version); print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name())'; } > "$OUT/device.txt" 2>&1
cat "$OUT/device.txt"

stages=${*:-tests bench search smoke}
if [[ " $stages " == *" tests "* ]]; then
  echo "== pytest -m gpu"
  python3 -m pytest -m gpu -q -p no:cacheprovider -rs ${GPU_TESTS:-tests} 2>&1 | tee "$OUT/pytest-gpu.txt"
fi
if [[ " $stages " == *" bench "* ]]; then
  echo "== technique benchmark"
  # BENCH_ARGS, e.g. "--only flash compiled_chunked --batch 16 64 max" (default: all at 16)
  python3 tools/bench_techniques.py --out "$OUT/bench" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.txt"
  tar czf "$OUT/bench.tar.gz" -C "$OUT" bench && rm -rf "$OUT/bench"
fi
if [[ " $stages " == *" search "* ]]; then
  echo "== batch-size search: fit vs bisect, independent checks"
  # SEARCH_ARGS, e.g. "--fit offload --bisect --check offload" (default: every technique)
  python3 tools/bench_search.py --out "$OUT/search" ${SEARCH_ARGS:-} 2>&1 | tee "$OUT/search.txt"
  tar czf "$OUT/search.tar.gz" -C "$OUT" search && rm -rf "$OUT/search"
fi
if [[ " $stages " == *" floor "* ]]; then  # not in the default list: bash tools/gpu_check.sh floor
  echo "== exactness noise floor: the default study's data (.corpus: eltec_pol_corpus), config.yaml"
  python3 -m snakemake --cores all data/tokens/meta.json \
    --config "corpus={'source': 'mirror', 'mirror': '.corpus', 'dataset': 'eltec_pol_corpus'}" \
    > "$OUT/floor-data.log" 2>&1 || { tail -20 "$OUT/floor-data.log"; exit 1; }
  # FLOOR_ARGS, e.g. "--only flash compiled local128 --factors 2 3"
  python3 tools/bench_floor.py --out "$OUT/floor.json" ${FLOOR_ARGS:-} 2>&1 | grep -v "step/s" | tee "$OUT/floor.txt"
fi
if [[ " $stages " == *" plan "* ]]; then  # not in the default list: bash tools/gpu_check.sh plan
  # memopt plan against real searches at a configuration no study measured: config/map.yaml's
  # model PLAN_MODEL at PLAN_SEQ tokens under a PLAN_GIB budget (default: llama_360m, 8,192,
  # 40 GiB), techniques PLAN_TECHNIQUES; each search starts from the plan and records it
  # (plan_batch, plan_error). The map's data: eltec_pol_corpus from .corpus, its tokenizer.
  echo "== memopt plan against searches"
  mkdir -p "$OUT/plan"
  python3 - "$OUT/plan/config.yaml" <<'PY' || exit 1
import os, sys, yaml
c = yaml.safe_load(open("config/map.yaml"))
model = os.environ.get("PLAN_MODEL", "llama_360m")
c["model"] = {**c["model"], **c["map"]["models"][model], "seq_len": int(os.environ.get("PLAN_SEQ", 8192))}
c["map"], c["study"] = None, "plan_check"
c["corpus"] = {**c["corpus"], "source": "mirror", "mirror": ".corpus", "dataset": "eltec_pol_corpus"}
c["search"]["memory_budget_gib"] = float(os.environ.get("PLAN_GIB", 40))
keep = os.environ.get("PLAN_TECHNIQUES", "flash ckpt_chunked compiled").split()
c["techniques"] = {k: v for k, v in c["techniques"].items() if k in keep}
c["baseline"] = keep[0]
yaml.safe_dump(c, open(sys.argv[1], "w"), sort_keys=False)
PY
  python3 -m snakemake --cores all data/tokens/meta.json --configfile "$OUT/plan/config.yaml" \
    > "$OUT/plan/data.log" 2>&1 || { tail -20 "$OUT/plan/data.log"; exit 1; }
  python3 -m memopt.run.cli plan --config "$OUT/plan/config.yaml" --gpu-memory H100-80GB | tee "$OUT/plan/plan.md"
  for t in ${PLAN_TECHNIQUES:-flash ckpt_chunked compiled}; do
    python3 -m memopt.run.cli search "$t" --config "$OUT/plan/config.yaml" --out "$OUT/plan/$t.json" --force 2>&1 \
      | grep -v "step/s" | tee "$OUT/plan/$t.log" | tail -1
    python3 -c "import json,sys; s=json.load(open(sys.argv[1])); print(sys.argv[2], 'plan', s['plan_batch'], 'proven', s['max_batch'], 'error', s['plan_error'], 'trials', s['n_trials'], 'budget MiB', round(s['budget_mib']))" "$OUT/plan/$t.json" "$t"
    # the tokens/s at the proven maximum, against the plan's (a cell at a search's max)
    python3 -m memopt.run.cli cell "$t" max --config "$OUT/plan/config.yaml" --search-dir "$OUT/plan" \
      --out "$OUT/plan/cell-$t.json" --force > "$OUT/plan/cell-$t.log" 2>&1 || tail -5 "$OUT/plan/cell-$t.log"
    python3 -c "import json,sys; c=json.load(open(sys.argv[1])); print(sys.argv[2], 'cell at', c['batch_size'], c['status'], 'tokens/s', round(c['tokens_per_s'] or 0))" "$OUT/plan/cell-$t.json" "$t"
  done
fi
[[ " $stages " == *" smoke "* ]] || exit 0
echo "== smoke study on CUDA (its profile: runs/smoke/)"
S=runs/smoke
SMOKE=(python3 -m snakemake --profile profiles/smoke --config "corpus={'source': 'mirror', 'mirror': '$MIRROR', 'dataset': '$DATASET'}")
rm -rf "$S"
start=$(date +%s)
"${SMOKE[@]}" > "$OUT/smoke.log" 2>&1
echo "smoke exit $? in $(( $(date +%s) - start )) s" | tee -a "$OUT/smoke.log"
"${SMOKE[@]}" -n 2>&1 | tail -2 | tee -a "$OUT/smoke.log"
grep -E "Finished jobid|^\[" "$OUT/smoke.log" | tail -4
# The default study's device check passes where CUDA is present (it stops a CPU-only machine).
python3 -c "from memopt.run.study_run import check_device_here as c; c({'device': 'cuda'}, {'search'}, ['snakemake']); print('device check: cuda present, passes')" 2>&1 | tee -a "$OUT/smoke.log"
cp "$S/results/summary.csv" "$S/paper/paper.md" "$OUT/" 2>/dev/null
tar czf "$OUT/smoke-results.tar.gz" -C "$S" results logs paper/paper.md paper/paper.tex paper/figures data/corpus/stats.json data/tokens/meta.json 2>/dev/null
python3 -c "import csv,sys; [print(*r.values(), sep=\" | \") for r in csv.DictReader(open(\"$S/results/summary.csv\"))]" | cut -c1-300
