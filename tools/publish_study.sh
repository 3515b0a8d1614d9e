#!/usr/bin/env bash
# Publish a study that tools/gpu_study.sh ran: its saved state becomes a snapshot folder (to commit)
# whose paper anyone can regenerate from the results, without a GPU or Snakemake:
#   bash tools/publish_study.sh STATE.tar.gz DEST [DATASET]
# (STUDY_CONFIG names the study's config if it is not config.yaml, as for gpu_study.sh.)
# DEST gets config.yaml (the study as run: config.yaml with the offline corpus), results/ (cells,
# searches, Snakemake benchmarks, summary.csv), data/ (corpus, token and tokenizer statistics; not
# the corpus), logs/ (every rule's log; study-pieces.log: which machine ran which piece; study-run.log:
# when each target started), repeats/ where the state has them (STUDY_REPEATS: cells run again) and
# paper/ (md, tex, pdf, figures),
# rendered by:  memopt paper --config DEST/config.yaml --results DEST/results --data DEST/data --out DEST/paper --pdf
set -euo pipefail
state=${1:?usage: publish_study.sh STATE.tar.gz DEST [DATASET]}
dest=${2:?usage: publish_study.sh STATE.tar.gz DEST [DATASET]}
dataset=${3:-eltec_pol_corpus}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tar xzf "$state" -C "$tmp"
rm -rf "$dest"
mkdir -p "$dest"/data/{corpus,tokens,tokenizer}
cp -r "$tmp/results" "$dest/results"
rm -f "$dest/results/README.md"
cp "$tmp/data/corpus/stats.json" "$dest/data/corpus/"
cp "$tmp/data/tokens/meta.json" "$dest/data/tokens/"
cp "$tmp/data/tokenizer/spm.json" "$dest/data/tokenizer/"
cp -r "$tmp/logs" "$dest/logs"
[ ! -d "$tmp/repeats" ] || cp -r "$tmp/repeats" "$dest/repeats"  # gpu_study.sh STUDY_REPEATS
python3 - "$dest/config.yaml" "$dataset" "${STUDY_CONFIG:-config.yaml}" <<'PY'
import sys, yaml
config = yaml.safe_load(open(sys.argv[3]))
config["corpus"].update(source="mirror", mirror=".corpus", dataset=sys.argv[2])
with open(sys.argv[1], "w") as f:
    f.write("# config.yaml as run (gpu_study.sh): the corpus from an offline speakleash mirror\n")
    yaml.safe_dump(config, f, sort_keys=False)
PY
memopt paper --config "$dest/config.yaml" --results "$dest/results" --data "$dest/data" \
  --out "$dest/paper" --pdf
