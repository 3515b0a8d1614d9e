"""Figure numbers in the study paper: the Markdown numbers its captions in the order the figures
appear (LaTeX numbers its floats the same way), and each section that shows figures opens with a
line that refers to each of them by number (LaTeX: \\ref to its label), so that no figure goes
unreferred to."""

from __future__ import annotations

import re

# a figure line of the Markdown paper: ![caption](folder/name.png)
FIGURE = re.compile(r"^!\[(.*)\]\((.*/)?([A-Za-z0-9_]+)\.png\)$")
# what each figure shows, in the line that refers to it
SHOWS = {
    "throughput": "tokens/s per cell",
    "tradeoff": "memory against speed",
    "max_batch": "each technique's maximum batch",
    "positions": "validation loss by position",
    "loss": "the quality runs' training loss",
    "windows": "windows against full attention",
    "phases": "what fills the peak",
    "memory": "peak memory per cell",
    "memory_batch": "peak memory against batch in the searches",
    "speed_batch": "tokens/s against batch",
    "map_tokens_by_length": "the map's maxima by length",
    "map_tokens_by_size": "the map's maxima by model size",
}


def _title(text: str) -> str:
    """A section's title as both formats write it: no number, no 'Appendix: ', lower case."""
    text = re.sub(r"^\d+ ", "", text.strip())
    return text.removeprefix("Appendix: ").lower()


def _guide(names: list[str], ref) -> str:
    parts = [f"{SHOWS.get(n, n.replace('_', ' '))} ({ref(n)})" for n in names]
    listed = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    return f"This section shows {listed}."


def number_figures(md: str, tex: str) -> tuple[str, str]:
    """(md, tex) with the Markdown's captions numbered and a line after each heading of a section
    with figures that refers to them: 'Figure N' in the Markdown, 'Figure~\\ref{fig:name}' in the
    LaTeX (whose figure macro labels each float fig:name)."""
    sections: dict[str, list[str]] = {}
    current = None
    for line in md.split("\n"):
        if line.startswith(("## ", "### ")):
            current = _title(line.lstrip("#"))
        found = FIGURE.match(line)
        if found:
            sections.setdefault(current, []).append(found[3])
    number = {n: i + 1 for i, n in enumerate(n for names in sections.values() for n in names)}
    out = []
    for line in md.split("\n"):
        found = FIGURE.match(line)
        if found:
            line = f"![Figure {number[found[3]]}: {found[1]}]({found[2] or ''}{found[3]}.png)"
        out.append(line)
        title = _title(line.lstrip("#")) if line.startswith(("## ", "### ")) else None
        if title is not None and title in sections:
            out += ["", _guide(sections[title], lambda n: f"Figure {number[n]}")]
    tex_out = []
    for line in tex.split("\n"):
        tex_out.append(line)
        head = re.match(r"^\\(?:sub)?section\*?\{(.*)\}$", line)
        if head and _title(head[1]) in sections:
            names = sections[_title(head[1])]
            tex_out += ["", _guide(names, lambda n: f"Figure~\\ref{{fig:{n}}}")]
    return "\n".join(out), "\n".join(tex_out)
