"""The report: results read back into tidy tables (summary.csv, quality.csv), the analysis and
verdicts over them, the figures, and the paper's context rendered to Markdown and LaTeX through
the Jinja2 templates in paper/templates. Reads result files; trains nothing."""
