"""A table of the paper, as data: columns, rows, caption and notes, written once in the Markdown
subset the prose uses (`code`, **bold**, *emphasis*), and two small format functions that render
it as a Markdown pipe table and as a LaTeX booktabs table (text through md_to_tex, as the prose).

The tables themselves are built from the paper's context in memopt.report.paper_tables; the
templates place them (`{{ tables.search | table }}`), each format's environment supplying its own
`table` filter.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from memopt.report.paper_format import md_to_tex

# The default paper's numbered tables in the order it shows them: the main text's, then the
# appendix's (paper/templates/paper.{md,tex}.j2). Those a study has are numbered 1, 2, ... in this
# order (table_numbers); captions and prose cite them by these numbers (`tn` in the templates).
TABLE_ORDER = (
    "relative", "search", "quality", "positions", "increments", "recommend",  # main text
    "results", "memory", "exactness", "optimal",  # appendix
)  # fmt: skip
# With a quality study linked in (paper.quality), its verdicts' table follows the results, and
# the paper's own loss-by-position table is in the appendix, after the exactness runs
# (paper/templates/paper.*.j2)
LINKED_QUALITY_ORDER = (
    "relative", "search", "quality", "increments", "linked_quality", "recommend",
    "results", "memory", "exactness", "positions", "optimal",
)  # fmt: skip


def number(ctx: dict, name: str) -> int | None:
    """Table `name`'s number: ctx["tn"] (memopt.report.paper_tables.build sets it), else as if the
    study had every table."""
    return (ctx.get("tn") or table_numbers(TABLE_ORDER)).get(name)


def table_numbers(present, order=TABLE_ORDER) -> dict[str, int]:
    """{name: number} for the tables of `order` in `present`, numbered in that order."""
    present = set(present)
    return {name: i + 1 for i, name in enumerate(n for n in order if n in present)}


@dataclass(frozen=True)
class Span:
    """A cell across `columns` columns (a row that has no measurements: out of memory)."""

    text: str
    columns: int


@dataclass
class Table:
    columns: list[str]  # headers
    align: str  # a letter per column: l (text) or r (numbers)
    rows: list[list] = field(default_factory=list)  # cells: text, or Span
    caption: str = ""
    number: int | None = None  # "Table N: " in Markdown, a numbered caption in LaTeX; None: neither
    label: str | None = None  # LaTeX: tab:<label>
    notes: list[str] = field(default_factory=list)  # paragraphs under the table
    footer: list[list] = field(default_factory=list)  # rows under a rule (totals)
    layout: str = (
        "plain"  # LaTeX: plain | shrink (only if too wide) | resize (to the line) | sideways
    )
    size: str = "small"  # LaTeX font size
    colspec: str | None = None  # LaTeX column types when `align` is not enough (paragraph columns)

    def __post_init__(self):
        widths = {len(self.columns), len(self.align)}
        widths |= {sum(c.columns if isinstance(c, Span) else 1 for c in r) for r in self.all_rows()}
        if len(widths) != 1:
            raise ValueError(f"table {self.label or self.caption[:40]!r}: column counts {widths}")

    def all_rows(self) -> list[list]:
        return [*self.rows, *self.footer]


def _md_row(row: list) -> str:
    cells = []
    for cell in row:
        text = cell.text if isinstance(cell, Span) else cell
        cells.append("n/a" if text is None else str(text).replace("|", r"\|").replace("\n", " "))
        cells += [""] * (cell.columns - 1 if isinstance(cell, Span) else 0)
    return "|" + "|".join(f" {c} " for c in cells) + "|"


def markdown(table: Table | None) -> str:
    """The table as Markdown: its caption (numbered "Table N: "), the pipe table, its notes."""
    if table is None:
        return ""
    out = []
    if table.caption:
        out += [(f"Table {table.number}: " if table.number else "") + table.caption, ""]
    out.append(_md_row(table.columns))
    out.append("|" + "|".join("---:" if a == "r" else "---" for a in table.align) + "|")
    out += [_md_row(row) for row in table.all_rows()]
    return "\n".join(out) + "".join(f"\n\n{note}" for note in table.notes)


def _tex_cell(cell) -> str:
    if isinstance(cell, Span):
        return rf"\multicolumn{{{cell.columns}}}{{c}}{{{md_to_tex(cell.text)}}}"
    return "n/a" if cell is None else md_to_tex(str(cell))


def _tex_row(row: list, breakable: bool = False) -> str:
    text = " & ".join(_tex_cell(c) for c in row) + r" \\"
    # In paragraph columns a long name (flash_gradcp_chunked) may break after its underscores.
    return text.replace(r"\_", r"\_\allowbreak{}") if breakable else text


_FIT = {
    "plain": ("", ""),
    "shrink": ("\\resizebox{\\ifdim\\width>\\linewidth\\linewidth\\else\\width\\fi}{!}{%\n", "}"),
    "resize": ("\\resizebox{\\linewidth}{!}{%\n", "}"),
    "sideways": ("\\resizebox{\\linewidth}{!}{%\n", "}"),
}


def latex(table: Table | None) -> str:
    """The table as a LaTeX float (booktabs rules; a sideways one in landscape), its caption
    numbered or not, and its notes under it, inside the float."""
    if table is None:
        return ""
    env = "sidewaystable" if table.layout == "sideways" else "table"
    out = [
        rf"\begin{{{env}}}" + ("" if env == "sidewaystable" else "[htbp]"),
        rf"\centering\{table.size}",
    ]
    if table.caption:
        star = "" if table.number else "*"
        out.append(rf"\caption{star}{{{md_to_tex(table.caption)}}}")
    if table.label and table.number:  # (an unnumbered caption gives a label nothing to name)
        out.append(rf"\label{{tab:{table.label}}}")
    head, tail = _FIT[table.layout]
    out.append(head + rf"\begin{{tabular}}{{{table.colspec or table.align}}}")
    out += [r"\toprule", " & ".join(md_to_tex(h) for h in table.columns) + r" \\", r"\midrule"]
    breakable = table.colspec is not None
    out += [_tex_row(r, breakable) for r in table.rows]
    if table.footer:
        out += [r"\midrule", *(_tex_row(r, breakable) for r in table.footer)]
    out += [r"\bottomrule", r"\end{tabular}" + tail]
    if table.notes:  # inside the float, under the table (as paragraphs after it they stayed put
        # while the float moved pages away)
        notes = r"\par ".join(md_to_tex(note) for note in table.notes)
        out += [
            r"\par\smallskip\begin{minipage}{\linewidth}\footnotesize",
            notes,
            r"\end{minipage}",
        ]
    out.append(rf"\end{{{env}}}")
    return "\n".join(out)
