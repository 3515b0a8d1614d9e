# Adapter: rule map_aggregate -> memopt.report.map_results.map_table -> results/map.csv
import json
from pathlib import Path

from memopt.report.map_results import map_table

sm = snakemake  # noqa: F821
vocab = json.loads(Path(sm.input.tokens).read_text())["vocab_size"]
results = Path(sm.output[0]).parent
table = map_table(dict(sm.params.points), dict(sm.params.models), list(sm.params.order), vocab, results)
table.to_csv(sm.output[0], index=False)
print(f"{sm.output[0]}: {len(table)} rows")
