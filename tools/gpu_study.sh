#!/usr/bin/env bash
# The default study (config.yaml) on a GPU machine reached through the device tool, in pieces:
# one device call may run 10 minutes and one machine is held 30, while the study takes longer, so
# the study runs in the background (setsid) and later calls wait on it; at the end of a machine,
# `save` packs the state, and the next machine's `start` restores it and Snakemake goes on.
#
#   carry [".whl", ".corpus", ".study"]; commands, from the repository root:
#     MEMOPT_GIT_COMMIT=<sha> bash tools/gpu_study.sh start DEADLINE_S   # restore, launch
#     bash tools/gpu_study.sh wait SECONDS                              # progress, at most SECONDS
#     bash tools/gpu_study.sh save                                      # state -> $OUT/state.tar.gz
#     MEMOPT_GIT_COMMIT=<sha> bash tools/gpu_study.sh cells BATCH       # every technique at BATCH
#   Here, between machines: mkdir -p .study && cp <files_at>/state.tar.gz .study/
#   (`wait N; save` in every call: a machine lost between calls loses only that call's work; a
#   map point is saved only whole, so a point cut off mid-way runs again, whole, on the next
#   machine, and every point's searches and cells come from one GPU; with STUDY_PARTIAL=pairs a
#   save keeps a cut point's whole technique pairs, each a search and its cell from one GPU, and
#   the next machine runs only the rest of it)
#
# .whl: wheels the GPU image lacks (../shared/hooks/device-wheels.sh); .corpus: speakleash.json and
# eltec_pol_corpus.* from ../shared/corpus/speakleash. The corpus mirror is given relative (.corpus)
# so the params Snakemake records do not depend on where the machine puts the checkout.
#
# Data (corpus, tokenizer, tokens: ~20 s) is rebuilt on every machine rather than carried (77 MB);
# its SHA-256 sums must equal the first machine's, whose modification times it then gets back. The
# sources get one fixed old modification time before every Snakemake call (a copied checkout has
# fresh ones), so Snakemake's usual rerun triggers see exactly what one uninterrupted run would.
#
# STUDY_CONFIG / STUDY_DATASET run another study (tests/test_gpu_study.py: a tiny one on the CPU);
# a map study (config/map.yaml) runs one point per target, so each point runs on one machine;
# STUDY_MAX_TARGETS runs only the first N targets; STUDY_ONLY (an extended regex) only the targets
# it matches (e.g. 'point:llama_1b_16384'); STUDY_REDO (a regex on map point names) drops
# those points' saved results on a fresh machine so they run again whole; STUDY_ONE_CALL=1 runs
# them all in one Snakemake call (no deadline: one machine for the whole study, no DAG rebuilt
# per target).
# STUDY_GPUS=N runs N jobs at once (--resources gpu=N; memopt.runtime.lease gives each its own GPU);
# a map study on N GPUs runs one Snakemake per GPU (CUDA_VISIBLE_DEVICES): each takes the largest
# unclaimed point whose estimate still fits, so every point's searches and cells run on one GPU
# (logs/study-run-gpuG.log; the host's pinned memory is shared: memopt.runtime.offload); another
# study on N GPUs runs the targets that N GPUs finish before the deadline in one Snakemake call.
# STUDY_REPEATS='POINT:TECH[,TECH...]:N' (a map study): the first GPU with no point left to run,
# once that point is whole here, runs those cells N more times each before the deadline, into
# repeats/ (run_repeats): how far a cell at the maximum moves between runs on one card.
#
# `start DEADLINE_S` runs the targets below in order, each only while its estimate still fits
# before the deadline (seconds after start); the rest waits for the next machine.
set -uo pipefail
OUT=${OUT:-/tmp/memopt-study-out}
STATE=.study/state.tar.gz
RUNLOG=logs/study-run.log
# STUDY_CONFIG: another config (the quality or map study; the tests' tiny one). `start` records it
# in .study/config, and `wait` and `save` use that one when STUDY_CONFIG is unset: a save that
# silently took config.yaml would not see a map point's unpaired searches.
RECORDED=$(cat .study/config 2>/dev/null)
CONFIGFILE=${STUDY_CONFIG:-${RECORDED:-config.yaml}}
if [ "${1:-}" != start ] && [ -n "$RECORDED" ] && [ "$CONFIGFILE" != "$RECORDED" ]; then
  echo "gpu_study.sh: STUDY_CONFIG=$CONFIGFILE, but the study started here runs $RECORDED" >&2
  exit 2
fi
CORPUS="corpus={'source': 'mirror', 'mirror': '.corpus', 'dataset': '${STUDY_DATASET:-eltec_pol_corpus}'}"
# Targets in order with their estimates (H100 seconds; tools/bench_overhead.py): the searches (with
# the exactness runs), every cell, every quality run (from its tokens), the paper. On a CPU: 20 s.
make_targets() {  # after setup: memopt's config needs the carried wheels (jsonschema)
mapfile -t TARGETS < <(python3 - "$CONFIGFILE" <<'PY'
import os, sys, yaml
sys.path.insert(0, "src")
from memopt.config import validate_config
from memopt.runtime.functions import functions
c = validate_config(yaml.safe_load(open(sys.argv[1])))
cuda = c["device"] == "cuda"  # a CPU study (the tests' tiny one): 20 s a target
if c["map"]:  # a map study: one target per point (its searches and cells on one machine)
    from memopt.map_points import map_points
    from memopt.runtime.flops import param_count
    for point, model in map_points(c).items():  # seconds (20 s on a CPU): on an H200 with the
        # searches from memopt plan's maxima (6a85181), 1,073 s for llama_1b_1024 and about 690
        # for gpt2_110m_1024; on an H100 at f0247d6 (searches from batch 1) 600-800 s for the
        # small models' points and 1,000-1,300 for the large ones' (900 + 300 B + L / 64 there)
        billions = param_count(model, c["tokenizer"]["vocab_size"]) / 1e9
        est = int(700 + 350 * billions + model["seq_len"] // 64) if cuda else 20
        # a point cut short (STUDY_PARTIAL=pairs): only its techniques left, each by its usual
        # share of a point (the H200 map's 9 points: checkpointing 3.5, offloading 4.5, compiling
        # 2 and the others 1, within about 1 of each)
        weight = {t: 1 + (1 if k.get("compile") else 0) + (2.5 if k.get("checkpointing", "none") != "none" else 0)
                  + (1 if k.get("offload", "none") != "none" else 0) for t, k in c["techniques"].items()}
        left = sum(w for t, w in weight.items() if not (os.path.exists(f"results/map/{point}/search/{t}.json")
                   and os.path.exists(f"results/map/{point}/cells/{t}/max.json")))
        est = int(est * left / sum(weight.values()))
        print(f"point:{point}", est)
    print("results/map.csv 20")
    sys.exit()
print("searches", 360 if cuda else 20)
for t in c["techniques"]:
    for b in c["batch_sizes"]:
        big = c["techniques"][t].get("checkpointing", "none") != "none" and b == "max"
        print(f"results/cells/{t}/{b}.json", (90 if big else 60) if cuda else 20)
tokens = c["quality"]["tokens"] or 12_000_000  # null: one epoch (eltec_pol_corpus: ~11.5M)
for f in functions(c["techniques"]):  # H100 tokens/s of the default model at batch 32, rounded
    # down from studies/h100-default's quality runs (fp32 58k, tf32 161k, bf16 388k, 8-bit 156k)
    rate = 140_000 if "adamw8bit" in f else {"fp32": 50_000, "tf32": 140_000}.get(f.split("_")[0], 250_000)
    for i in range(c["quality"]["seeds"]):
        est = int(30 + tokens / rate) if c["device"] == "cuda" else 20
        print(f"results/quality/{f}/{c['train']['seed'] + i}.json", est)
print("paper", 90 if cuda else 20)
PY
)
}

setup() {
  if [ -d .whl ] && [ ! -d /tmp/site/snakemake ]; then  # once per machine
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl || exit 1
  fi
  if [ -d .whl ] && [ -d /tmp/site ]; then export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH; fi
  export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
}

smk() {
  find Snakefile config.yaml config envs workflow src paper/templates -type f \
    -exec touch -d @1767225600 {} +   # 2026-01-01: older than any result of the study
  python3 -m snakemake "$@" --cores all --resources gpu=${STUDY_GPUS:-1} ${SMK_NOLOCK:+--nolock} \
    --configfile "$CONFIGFILE" --config "$CORPUS"
}
# The data that must be identical on every machine (stats.json and spm.json name local paths and
# times: the first piece's copies come back with the state).
SAME="data/corpus/train.jsonl data/corpus/val.jsonl data/tokenizer/spm.model data/tokens/train.bin
  data/tokens/val.bin data/tokens/meta.json"
DATA="$SAME data/corpus/stats.json data/tokenizer/spm.json"

# A log line that reports an error: Snakemake's "Error in rule ...", a Python exception's last
# line ("FileNotFoundError: ...", "torch.OutOfMemoryError: ...")
ERRORS='^([A-Za-z_.]*(Error|Exception)\b|Error in rule)'

target_files() {  # one line per Snakemake call (run_files)
  if [[ "$1" == point:* ]]; then  # a map point: each technique's search and cell, in turn
    python3 -c "import yaml; p='${1#point:}'; print(*(f'results/map/{p}/search/{t}.json results/map/{p}/cells/{t}/max.json' for t in yaml.safe_load(open('$CONFIGFILE'))['techniques']), sep='\n')"
  elif [ "$1" = searches ]; then
    python3 -c "import yaml; print(' '.join(f'results/search/{t}.json' for t in yaml.safe_load(open('$CONFIGFILE'))['techniques']))"
  else
    echo "$1"
  fi
}

run_files() {  # one Snakemake call per line of target_files: a map point's techniques one by one,
  # each cell right after its search (a machine taken back mid-point keeps the pairs: `save`)
  local line
  while read -r line; do
    [ -n "$line" ] || continue
    smk $line < /dev/null || return 1
  done <<< "$1"
}

run_targets() {  # the background job: each target while its estimate fits before the deadline
  local deadline=$1 t0=$SECONDS entries=("${TARGETS[@]:0:${STUDY_MAX_TARGETS:-${#TARGETS[@]}}}")
  if [ -n "${STUDY_ONE_CALL:-}" ]; then  # the whole study in one Snakemake call, as a user runs it
    all=$(for entry in "${entries[@]}"; do target_files "${entry%% *}"; done)
    echo "== all targets in one Snakemake call at $(date -u +%T)"
    smk $all || echo "== study FAILED"
    echo "== piece finished at $(date -u +%T) after $(( SECONDS - t0 )) s"
    return
  fi
  for entry in "${entries[@]}"; do  # (a test runs fewer)
    read -r target est <<< "$entry"
    [[ -z "${STUDY_ONLY:-}" || "$target" =~ $STUDY_ONLY ]] || continue
    files=$(target_files "$target")
    if smk -n $files 2>&1 | grep -q "Nothing to be done"; then
      echo "== $target: done before"
      continue
    fi
    left=$(( deadline - (SECONDS - t0) ))
    if [ "$est" -gt "$left" ]; then
      echo "== $target: estimate ${est}s > ${left}s left before the deadline; stopping here"
      break
    fi
    echo "== $target (estimate ${est}s, ${left}s left) at $(date -u +%T)"
    run_files "$files" || { echo "== $target FAILED"; break; }
  done
  [ -z "${STUDY_REPEATS:-}" ] || run_repeats "${CUDA_VISIBLE_DEVICES:-0}" "$deadline" "$(( $(date +%s) - (SECONDS - t0) ))"
  echo "== piece finished at $(date -u +%T) after $(( SECONDS - t0 )) s"
}

stop_workers() {  # memopt's warm workers that run in folder $1 on GPU $2 (CUDA_VISIBLE_DEVICES),
  # asked to exit (each idle here: its GPU has no job left) and waited for
  python3 - "$1" "$2" <<'PY'
import os, sys, time
from pathlib import Path
from memopt.run.worker import _exchange  # the workers' own protocol
folder, gpu = os.path.realpath(sys.argv[1]), sys.argv[2]
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        argv = open(f"/proc/{pid}/cmdline", "rb").read().decode().split("\0")
        env = open(f"/proc/{pid}/environ", "rb").read().decode(errors="replace").split("\0")
        cwd = os.path.realpath(f"/proc/{pid}/cwd")
    except OSError:
        continue
    seen = [v.split("=", 1)[1] for v in env if v.startswith("CUDA_VISIBLE_DEVICES=")]
    if "memopt.run.worker" not in argv or cwd != folder or seen not in ([gpu], [] if gpu == "0" else None):
        continue  # (unset: a one-GPU machine's, on its GPU 0)
    _exchange(Path(argv[argv.index("memopt.run.worker") + 1]), {"op": "exit"})
    for _ in range(300):  # gone, or a zombie no one reaps
        try:
            if open(f"/proc/{pid}/stat").read().split()[2] == "Z":
                break
        except OSError:
            break
        time.sleep(0.1)
PY
}

. "$(dirname "${BASH_SOURCE[0]}")/gpu_study_repeats.sh"  # repeats_ready, run_repeats (STUDY_REPEATS)

run_pinned() {  # a map study on STUDY_GPUS GPUs: one Snakemake per GPU, points from one queue
  local deadline=$1 t0 claims entries
  t0=$(date +%s) claims=$(mktemp -d)
  mapfile -t entries < <(printf '%s\n' "${TARGETS[@]}" | grep '^point:' | sort -k2,2nr)
  for ((g = 0; g < STUDY_GPUS; g++)); do
    (
      # --nolock: Snakemake (9.27) ends a run by deleting the whole .snakemake/locks folder, so
      # one GPU's Snakemake ending took the folder from under another's starting one
      # (FileNotFoundError on 0.input.lock: llama_1b_4096 failed at 6 of 7 techniques on 4 H100s,
      # 2026-11-28). The claims below keep the GPUs' targets apart; the data is built before.
      export CUDA_VISIBLE_DEVICES=$g STUDY_GPUS=1 SMK_NOLOCK=1
      for entry in "${entries[@]}"; do
        read -r target est <<< "$entry"
        [[ -z "${STUDY_ONLY:-}" || "$target" =~ $STUDY_ONLY ]] || continue
        left=$(( deadline - ($(date +%s) - t0) ))
        [ "$est" -le "$left" ] || continue  # a smaller point may still fit
        mkdir "$claims/${target#point:}" 2>/dev/null || continue  # another GPU's
        files=$(target_files "$target")
        smk -n $files 2>&1 | grep -q "Nothing to be done" && continue
        echo "== gpu $g: $target (estimate ${est}s, ${left}s left) at $(date -u +%T)"
        run_files "$files" >> "logs/study-run-gpu$g.log" 2>&1 \
          || echo "== gpu $g: $target FAILED: $(grep -E "$ERRORS" "logs/study-run-gpu$g.log" | tail -1)"
        echo "== gpu $g: $target ended at $(date -u +%T)"
      done
      # the first GPU with no point left whose repeats' cells are here (a point of this piece
      # may still be running on another GPU)
      if [ -n "${STUDY_REPEATS:-}" ] && repeats_ready && mkdir "$claims/repeats" 2>/dev/null; then
        run_repeats "$g" "$deadline" "$t0"
      fi
    ) &
  done
  wait
  rm -rf "$claims"  # (results/map.csv and the paper: memopt paper, or a 1-GPU piece)
  echo "== piece finished at $(date -u +%T) after $(( $(date +%s) - t0 )) s"
}

all_exist() { local f; for f in "$@"; do [ -f "$f" ] || return 1; done; }

run_parallel() {  # another study on STUDY_GPUS GPUs: one Snakemake with gpu=N (the lease gives
  # each job its own GPU) for as many targets, in order, as N GPUs finish before the deadline
  # (they end by sum/N + the longest one: the last jobs end unevenly)
  local deadline=$1 t0 sum=0 longest=0 n=0 picked=() files
  t0=$(date +%s)
  for entry in "${TARGETS[@]}"; do
    read -r target est <<< "$entry"
    [[ -z "${STUDY_ONLY:-}" || "$target" =~ $STUDY_ONLY ]] || continue
    files=$(target_files "$target")
    # done before: its files exist (a frozen commit, and results written whole); not `smk -n`,
    # which builds the DAG per target (~4 s each: 3.5 minutes of four GPUs for the quality study)
    all_exist $files && { echo "== $target: done before"; continue; }
    local top=$(( est > longest ? est : longest ))
    if [ $(( (sum + est) / STUDY_GPUS + top )) -gt $(( deadline * 9 / 10 )) ]; then
      echo "== $target (estimate ${est}s) would end after the deadline on $STUDY_GPUS GPUs; stopping here"
      break
    fi
    sum=$(( sum + est )) longest=$top n=$(( n + 1 )) picked+=($files)
  done
  echo "== $n targets on $STUDY_GPUS GPUs in one Snakemake call at $(date -u +%T)"
  [ ${#picked[@]} -eq 0 ] || smk --keep-going "${picked[@]}" || echo "== study FAILED"
  echo "== piece finished at $(date -u +%T) after $(( $(date +%s) - t0 )) s"
}

case ${1:-} in
  start)
    setup
    mkdir -p .study && echo "$CONFIGFILE" > .study/config
    mkdir -p logs "$OUT"
    info=$({ nvidia-smi -L; hostname; echo "commit ${MEMOPT_GIT_COMMIT:-unset}"; } 2>&1)
    python3 -c "import psutil, snakemake, speakleash" || exit 1
    if [ ! -f data/tokens/meta.json ]; then  # a fresh machine: rebuild the data, check it is the same
      start=$SECONDS
      smk data/tokens/meta.json > /tmp/study-data.log 2>&1 || { tail -30 /tmp/study-data.log; exit 1; }
      info+=$'\n'"data rebuilt in $(( SECONDS - start )) s"
      if [ -f "$STATE" ]; then
        tar xzf "$STATE" data/study.sha256 && sha256sum --quiet -c data/study.sha256 \
          || { echo "the rebuilt data differs from the first piece's"; exit 1; }
        # Results, logs, benchmarks and metadata of earlier machines' pieces (a later piece on
        # this machine keeps its own: the state is older than them)
        tar xzf "$STATE"
        # STUDY_REDO (an extended regex on map point names): those points' earlier results are
        # dropped on this machine, so they run again whole here (the saved state keeps them until
        # this machine's save replaces them)
        for p in $(ls results/map 2>/dev/null | grep -E "${STUDY_REDO:-^$}"); do
          echo "STUDY_REDO: map point $p runs again" | tee -a logs/study-pieces.log
          rm -rf "results/map/$p" "logs/map/$p" "results/benchmarks/map/$p"
        done
      fi
    fi
    # A study killed here (kill -9, a crash) leaves Snakemake's lock: memopt unlock removes it once
    # no Snakemake run and none of its jobs runs in this folder (docs/running.md, "When a run is
    # interrupted"); it refuses, and the piece stops, while one still does.
    python3 -m memopt.run.cli unlock || exit 1
    make_targets  # after the restore: a point's estimate counts only what is left of it
    if [ -f data/study.mtimes ]; then  # the first piece's times: the data is as old as it was there
      while read -r t f; do touch -d "@$t" "$f"; done < data/study.mtimes
    else
      sha256sum $SAME > data/study.sha256
      stat -c '%.9Y %n' $DATA > data/study.mtimes
    fi
    echo "$info"$'\n'"piece start $(date -u +%FT%TZ), deadline ${2:?deadline seconds}" | tee -a logs/study-pieces.log
    echo "== piece start $(date -u +%T)" >> "$RUNLOG"
    run=run_targets
    [ ${#TARGETS[@]} -gt 0 ] || { echo "no targets: is $CONFIGFILE a study config?"; exit 1; }
    if [ "${STUDY_GPUS:-1}" -gt 1 ] && [ -z "${STUDY_ONE_CALL:-}" ]; then
      [[ "${TARGETS[0]}" == point:* ]] && run=run_pinned || run=run_parallel
    fi
    MEMOPT_GIT_COMMIT=${MEMOPT_GIT_COMMIT:?set MEMOPT_GIT_COMMIT to the commit being run} \
      STUDY_MAX_TARGETS=${STUDY_MAX_TARGETS:-} STUDY_ONLY=${STUDY_ONLY:-} STUDY_ONE_CALL=${STUDY_ONE_CALL:-} STUDY_GPUS=${STUDY_GPUS:-1} STUDY_REPEATS=${STUDY_REPEATS:-} setsid nohup bash -c "$(declare -p TARGETS CORPUS CONFIGFILE ERRORS); $(declare -f smk target_files run_files run_targets stop_workers repeats_ready run_repeats run_pinned all_exist run_parallel); $run $2" \
      >> "$RUNLOG" 2>&1 < /dev/null &
    echo "launched (pid $!)"
    ;;
  wait)
    [ -f "$RUNLOG" ] || { echo "no study is running here (start it first)"; exit 1; }
    limit=${2:-540} start=$SECONDS
    while [ $(( SECONDS - start )) -lt "$limit" ]; do
      grep "^== piece" "$RUNLOG" | tail -1 | grep -q finished && break
      sleep 10
    done
    awk '/^== piece start/ {buf = ""} {buf = buf $0 "\n"} END {printf "%s", buf}' "$RUNLOG" | grep -E "^== |steps \(|Error|error" | tail -40
    for log in logs/study-run-gpu*.log; do  # a map study on several GPUs: each GPU's Snakemake
      [ -f "$log" ] && echo "$log: $(grep -c "steps (100%)" "$log") techniques done; $(grep -cE "$ERRORS" "$log") errors"
    done
    echo "cells done: $(find results/cells results/map -path '*cells*' -name '*.json' 2>/dev/null | wc -l)," \
      "quality runs done: $(find results/quality -name '*.json' 2>/dev/null | wc -l)"
    ;;
  save)
    setup
    mkdir -p "$OUT" logs/worker
    cp /tmp/memopt-"$(id -u)"/*.log logs/worker/ 2>/dev/null  # the warm workers' own logs
    # pax keeps sub-second times: Snakemake compares them (data vs. benchmark and log files)
    # A map point is saved only whole (every technique's search and cell): a point cut off
    # mid-way is left out and runs again, whole, on the next machine's one GPU, so each point's
    # searches and cells all come from one GPU (issue 34). STUDY_PARTIAL=pairs keeps its whole
    # pairs (a technique's search and cell, one GPU's) and the next machine runs the rest: for
    # machines lost between calls, at the price of a point's techniques on more than one card
    # (the map paper names such points)
    cut=()
    partial=$(python3 - "$CONFIGFILE" <<'PY'
import os, sys, yaml
sys.path.insert(0, "src")
from memopt.config import validate_config
from memopt.map_points import map_points
c = validate_config(yaml.safe_load(open(sys.argv[1])))
for p in map_points(c):
    done = [os.path.exists(f"results/map/{p}/search/{t}.json") and os.path.exists(f"results/map/{p}/cells/{t}/max.json") for t in c["techniques"]]
    if os.path.isdir(f"results/map/{p}") and not all(done):
        print(f"{p}:{sum(done)}/{len(done)}:" + ",".join(t for t, d in zip(c["techniques"], done) if not d))
PY
    ) || { echo "save: could not tell which map points are whole: nothing saved"; exit 1; }
    for s in $partial; do
      IFS=: read -r p n left <<< "$s"
      if [ "${STUDY_PARTIAL:-}" = pairs ]; then  # its whole pairs stay; the rest runs on the next machine
        echo "save: map point $p has $n techniques done: those kept (STUDY_PARTIAL=pairs), $left left"
        for t in ${left//,/ }; do  # a search without its cell too: each pair comes from one GPU
          cut+=(--exclude="results/map/$p/search/$t.json" --exclude="results/map/$p/cells/$t"
            --exclude="logs/map/$p/search/$t.log" --exclude="logs/map/$p/cells/$t.log"
            --exclude="results/benchmarks/map/$p/search/$t.tsv" --exclude="results/benchmarks/map/$p/cell/$t.tsv")
        done
        continue
      fi
      echo "save: map point $p has $n techniques done: left out of the state (it runs again, whole)"
      cut+=(--exclude="results/map/$p" --exclude="logs/map/$p" --exclude="results/benchmarks/map/$p")
    done
    tar --format=posix -czf "$OUT/state.tar.gz" --exclude='*.pyc' --exclude='.*.tmp' "${cut[@]}" data/study.sha256 data/study.mtimes results logs .snakemake/metadata \
      data/corpus/stats.json data/tokens/meta.json data/tokenizer/spm.* $(ls -d paper/paper.* paper/figures repeats 2>/dev/null)
    rc=$?  # 1: a file changed while read (the study runs on); 2: no whole state (a full disk)
    [ $rc -le 1 ] || { echo "save: tar failed ($rc): $OUT/state.tar.gz is not a whole state"; rm -f "$OUT/state.tar.gz"; exit 1; }
    ls -la "$OUT"
    ;;
  cells)  # every technique of the config at one batch, e.g. the other GPU's: $OUT/cells/T/B.json
    setup
    mkdir -p "$OUT/cells"
    smk data/tokens/meta.json > /tmp/study-data.log 2>&1 || { tail -30 /tmp/study-data.log; exit 1; }
    nvidia-smi -L | tee "$OUT/cells/device.txt"
    for t in $(python3 -c "import yaml; print(*yaml.safe_load(open('$CONFIGFILE'))['techniques'])"); do
      MEMOPT_GIT_COMMIT=${MEMOPT_GIT_COMMIT:?set MEMOPT_GIT_COMMIT to the commit being run} \
        python3 -m memopt.run.cli cell "$t" "${2:?usage: $0 cells BATCH}" --config "$CONFIGFILE" \
        --out "$OUT/cells/$t/$2.json" > "$OUT/cells/$t.log" 2>&1
      tail -1 "$OUT/cells/$t.log"
    done
    tar czf "$OUT/cells.tar.gz" -C "$OUT" cells && rm -rf "$OUT/cells"  # one file comes back
    ;;
  *)
    echo "usage: $0 start DEADLINE_S | wait SECONDS | save | cells BATCH" >&2
    exit 2
    ;;
esac
