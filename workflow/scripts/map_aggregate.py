# Adapter: rule map_aggregate -> memopt.report.map_results -> results/map.csv, map_findings.json
import json
from pathlib import Path

from memopt.report.map_results import aggregate_map

sm = snakemake  # noqa: F821
vocab = json.loads(Path(sm.input.tokens).read_text())["vocab_size"]
points, models, order = dict(sm.params.points), dict(sm.params.models), list(sm.params.order)
table = aggregate_map(points, models, order, vocab, Path(sm.output.table).parent, sm.params.reference)
print(f"{sm.output.table}: {len(table)} rows")
