# Sourced by tools/gpu_study.sh: STUDY_REPEATS, the same cells of a whole map point run again on
# one card (how far a cell at the maximum moves between runs). Uses its smk, stop_workers,
# CONFIGFILE and ERRORS.

repeats_ready() {  # whether STUDY_REPEATS's cells are all here (whole) to be repeated
  local point techs t
  IFS=: read -r point techs _ <<< "$STUDY_REPEATS"
  for t in ${techs//,/ }; do [ -f "results/map/$point/cells/$t/max.json" ] || return 1; done
}

run_repeats() {  # STUDY_REPEATS='POINT:TECH[,TECH...]:N' on GPU $1 (deadline $2 s after $3):
  # each cell N more times, in a copy of the study's sources, data and that point's results (the
  # study's own cells, logs and Snakemake records stay as they are: a save mid-repeat keeps the
  # point whole), once this folder's warm worker on that GPU has exited (a second one would hold
  # memory beside it); the cells that come back go to repeats/POINT/rR/TECH.json (`save` keeps
  # them), a line each to the run's log (Snakemake's own output: logs/repeats-gpuG.log)
  local g=$1 deadline=$2 t0=$3 point techs n copy=/tmp/memopt-repeats-$1 r t f base took=60 start
  local log=$PWD/logs/repeats-gpu$1.log
  IFS=: read -r point techs n <<< "$STUDY_REPEATS"
  repeats_ready || { echo "== gpu $g: repeats: $point has not every cell of $techs here"; return 0; }
  stop_workers . "$g"
  rm -rf "$copy" && mkdir -p "$copy/results/map" "$copy/.snakemake" || return 0
  local copied=1
  for f in * .corpus .memopt-study; do  # not the other GPUs' results, logs and Snakemake files
    case $f in results | logs | repeats) ;; *) [ ! -e "$f" ] || cp -a "$f" "$copy/" || copied=0 ;; esac
  done
  [ $copied = 1 ] && cp -a "results/map/$point" "$copy/results/map/" \
    && cp -a .snakemake/metadata "$copy/.snakemake/" \
    || { echo "== gpu $g: repeats: copying the study failed"; return 0; }
  # the next free round (the highest before, not a count: a round where every cell failed leaves none)
  base=$(ls "repeats/$point" 2>/dev/null | sed -n 's/^r\([0-9]*\)$/\1/p' | sort -n | tail -1)
  for ((r = ${base:-0} + 1; r <= ${base:-0} + ${n:-3}; r++)); do
    for t in ${techs//,/ }; do
      # a cell starts only while the longest so far (60 s before the first) and a minute fit
      if [ $(( deadline - ($(date +%s) - t0) )) -lt $(( took + 60 )) ]; then
        echo "== gpu $g: repeats stopped before the deadline (round $r, $t)"; stop_workers "$copy" "$g"; return 0
      fi
      f=results/map/$point/cells/$t/max.json start=$(date +%s)
      rm -f "$copy/$f"
      (cd "$copy" && CUDA_VISIBLE_DEVICES=$g STUDY_GPUS=1 SMK_NOLOCK=1 smk "$f" >> "$log" 2>&1) \
        || { echo "== gpu $g: repeat $r of $point $t FAILED (logs/repeats-gpu$g.log)"; continue; }
      start=$(( $(date +%s) - start )) && took=$(( start > took ? start : took ))
      mkdir -p "repeats/$point/r$r" && cp "$copy/$f" "repeats/$point/r$r/.$t.json.tmp" \
        && mv -f "repeats/$point/r$r/.$t.json.tmp" "repeats/$point/r$r/$t.json"  # (whole in a save)
      python3 - "repeats/$point/r$r/$t.json" "$g" "$r" "$point" "$t" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
retries = (c.get("allocator_events") or {}).get("alloc_retries")
print(f"== gpu {sys.argv[2]}: repeat {sys.argv[3]} of {sys.argv[4]} {sys.argv[5]} at batch "
      f"{c['batch_size']}: {c['tokens_per_s']:,.0f} tokens/s, {retries} cudaMalloc retries in "
      f"{c['timed_steps']} timed steps ({c['provenance'].get('gpu_uuid')})")
PY
    done
  done
  stop_workers "$copy" "$g"  # its GPU free again
}
