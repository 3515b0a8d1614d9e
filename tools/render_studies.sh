#!/usr/bin/env bash
# Render every published study's paper again from its committed results (no GPU, no Snakemake),
# after a change to the paper's code or templates; tests/test_studies.py checks the result.
#   bash tools/render_studies.sh [NAME ...]     (default: every study that tests/test_studies.py lists: STUDIES, QUALITY_STUDIES)
set -euo pipefail
cd "$(dirname "$0")/.."
names=("$@")
[ ${#names[@]} -gt 0 ] || mapfile -t names < <(python3 -c \
  "import ast; t = ast.parse(open('tests/test_studies.py').read()); print('\n'.join(s for n in t.body if isinstance(n, ast.Assign) and getattr(n.targets[0], 'id', '') in ('STUDIES', 'QUALITY_STUDIES') for s in ast.literal_eval(n.value)))")
# the map first (tests/test_map_study.py checks it): the papers that link it use its figures
for map in h100-map h200-map; do
  [ $# -gt 0 ] || [ ! -f studies/$map/results/map.csv ] || names=($map "${names[@]}")
done
for name in "${names[@]}"; do
  s=studies/$name
  memopt paper --config "$s/config.yaml" --results "$s/results" --data "$s/data" --out "$s/paper" --pdf
done
