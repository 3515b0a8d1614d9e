#!/usr/bin/env bash
# One device call of a map piece (studies/h200-map/README.md, "How the pieces ran"), so that each call is one
# short command: carry [".whl", ".corpus", ".study"]; from the repository root,
#   bash tools/gpu_map_piece.sh first DEADLINE_S WAIT_S [STUDY_ONLY]   # a fresh machine
#   bash tools/gpu_map_piece.sh next WAIT_S                           # the same machine, later
# `first` unpacks the frozen commit's tree (.study/frozen-SHA7.tar.gz,
# from `git archive $MAP_COMMIT ':(exclude)studies'`) into $PIECE_DIR with this checkout's
# tools/gpu_study*.sh, .whl, .corpus and .study/state.tar.gz, and starts the piece
# (tools/gpu_study.sh start); both then wait at most WAIT_S and end with a save that keeps a cut
# point's whole technique pairs (STUDY_PARTIAL=pairs): $OUT/state.tar.gz comes back from every
# call. `next` on a machine that is gone (no $PIECE_DIR) exits 4: copy the last returned
# state.tar.gz to .study/ and call `first` again.
# STUDY_GPUS (default 1) is the number of GPUs, checked against nvidia-smi's (PIECE_GPU, default
# H200, names their model; none skips the check); STUDY_CONFIG defaults to config/map.yaml in
# `first`. `first` on a machine whose piece still runs exits 5 (call `next`).
set -uo pipefail
MAP_COMMIT=${MAP_COMMIT:-c7c8b9fbb922b393f0ba390b99b01e568913ce58}
PIECE_DIR=${PIECE_DIR:-/tmp/frozen}
export STUDY_GPUS=${STUDY_GPUS:-1}

# (gpu_study.sh's own setup installs the carried wheels once per machine and sets the paths)
finish() {  # wait, then save whatever whole pairs there are
  cd "$PIECE_DIR" || exit 4
  bash tools/gpu_study.sh wait "$1" | grep -v input: | tail -"${PIECE_TAIL:-14}"
  STUDY_PARTIAL=pairs bash tools/gpu_study.sh save | grep -v '^total\|^d' | tail -4
}

case ${1:-} in
  first)
    deadline=${2:?usage: $0 first DEADLINE_S WAIT_S [STUDY_ONLY]} wait=${3:?WAIT_S}
    export STUDY_CONFIG=${STUDY_CONFIG:-config/map.yaml}  # (`next`: the one `start` recorded)
    if [ -f "$PIECE_DIR/logs/study-run.log" ] \
      && ! grep "^== piece" "$PIECE_DIR/logs/study-run.log" | tail -1 | grep -q finished; then
      echo "a piece still runs in $PIECE_DIR on this machine: call next"  # (not two on one GPU)
      exit 5
    fi
    if [ "${PIECE_GPU:-H200}" != none ]; then  # (none: a test's CPU)
      gpus=$(nvidia-smi -L 2>/dev/null | tee /dev/stderr | grep -c "${PIECE_GPU:-H200}")
      [ "$gpus" -ge "$STUDY_GPUS" ] || { echo "need $STUDY_GPUS ${PIECE_GPU:-H200} GPUs, found $gpus"; exit 3; }
    fi
    frozen=.study/frozen-${MAP_COMMIT:0:7}.tar.gz
    [ -f "$frozen" ] || { echo "no $frozen: git archive --format=tar.gz -o $frozen $MAP_COMMIT ':(exclude)studies'"; exit 1; }
    rm -rf "$PIECE_DIR" && mkdir -p "$PIECE_DIR/.study" && tar xzf "$frozen" -C "$PIECE_DIR" \
      && cp tools/gpu_study*.sh "$PIECE_DIR/tools/" && cp -r .corpus "$PIECE_DIR/" || exit 1
    [ ! -d .whl ] || cp -r .whl "$PIECE_DIR/"  # (none on a test's CPU, which has the packages)
    [ ! -f .study/state.tar.gz ] || cp .study/state.tar.gz "$PIECE_DIR/.study/"
    (cd "$PIECE_DIR" && STUDY_ONLY=${4:-} MEMOPT_GIT_COMMIT=$MAP_COMMIT \
      bash tools/gpu_study.sh start "$deadline") || exit 1
    finish "$wait"
    ;;
  next)
    [ -d "$PIECE_DIR" ] || { echo "no piece here ($PIECE_DIR gone: a new machine)"; exit 4; }
    finish "${2:?usage: $0 next WAIT_S}"
    ;;
  *)
    echo "usage: $0 first DEADLINE_S WAIT_S [STUDY_ONLY] | next WAIT_S" >&2
    exit 2
    ;;
esac
