# Adapter: rule map_aggregate -> memopt.report.map_results -> results/map.csv, map_findings.json
import json
from pathlib import Path

from memopt.fileio import write_json
from memopt.report.map_results import map_findings, map_table

sm = snakemake  # noqa: F821
vocab = json.loads(Path(sm.input.tokens).read_text())["vocab_size"]
results = Path(sm.output.table).parent
table = map_table(
    dict(sm.params.points), dict(sm.params.models), list(sm.params.order), vocab, results
)
table.to_csv(sm.output.table, index=False)
write_json(Path(sm.output.findings), map_findings(table, sm.params.reference))
print(f"{sm.output.table}: {len(table)} rows")
