"""How the paper is written out: number and escaping filters for the templates, the Jinja2
environment (StrictUndefined: a missing value is an error, never an empty string) and the PDF
build. The context the templates get is built in memopt.report.paper."""

from __future__ import annotations

import math
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import jinja2
import yaml

from memopt.errors import MemoptError
from memopt.fileio import atomic_path
from memopt.knobs import defaults
from memopt.redact import redact


def num(value, decimals: int = 0) -> str:
    """1234.5 -> '1,234.5' (decimals fixed); None or NaN -> 'n/a' (an unmeasured value)."""
    if isinstance(value, jinja2.Undefined):
        str(value)  # StrictUndefined raises here, naming the missing variable
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:,.{decimals}f}"


def sig(value, decimals: int = 0) -> str:
    """num(value, decimals), with more decimals where those would leave fewer than two
    significant digits: 0.000123 GFLOP -> '0.00012', not '0.000' (a tiny model's numbers)."""
    if isinstance(value, (int, float)) and value and not math.isnan(value):
        decimals = max(decimals, 1 - math.floor(math.log10(abs(value))))
    return num(value, decimals)


def mib(value) -> str:
    """A size given in MiB: whole MiB from 1 MiB up (and 0), KiB or bytes below, so a small
    model's sizes never print as '0 MiB'."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if value == 0 or abs(value) >= 1:
        return f"{value:,.0f} MiB"
    if abs(value) * 1024 >= 1:
        return f"{value * 1024:,.0f} KiB"
    return f"{value * 2**20:,.0f} bytes"


def mparams(count, decimals: int = 1) -> str:
    """A parameter count: '124.4 M' from a million up, the count itself below ('30,976')."""
    if count >= 1e6:
        return f"{num(count / 1e6, decimals)} M"
    return f"{int(count):,}"


def pct(value, decimals: int = 1) -> str:
    """0.2345 -> '23.5%'; None or NaN -> 'n/a' (e.g. MFU on a device without a known peak)."""
    text = num(None if value is None else 100 * value, decimals)
    return text if text == "n/a" else text + "%"


_TEX_SPECIAL = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
}

# Characters the paper may use that pdflatex's utf8 input does not know (or sets badly): tex()
# replaces them in its one pass, so a value in a table is as safe as the prose.
_TEX_UNICODE = {
    "×": r"$\times$",
    "±": r"$\pm$",
    "≈": r"$\approx$",
    "→": r"$\rightarrow$",
    "≤": r"$\leq$",
    "≥": r"$\geq$",
    "²": r"$^2$",
    "³": r"\textsuperscript{3}",
    "¹": r"\textsuperscript{1}",
    "·": r"$\cdot$",
    "Δ": r"$\Delta$",
    "−": "-",
    "…": r"\dots{}",
    "–": "--",
    "†": r"$^\dagger$",
}

_TEX_CHARS = {**_TEX_SPECIAL, **_TEX_UNICODE}
_TEX_RE = re.compile("|".join(map(re.escape, _TEX_CHARS)))


def tex(value) -> str:
    """Escape LaTeX special characters in one pass (so the backslashes we add stay intact)."""
    return "n/a" if value is None else _TEX_RE.sub(lambda m: _TEX_CHARS[m.group()], str(value))


_CODE_RE = re.compile(r"`([^`]+)`")
_BOLD_RE = re.compile(r"\*\*(.+?)\*\*")
_QUOTE_RE = re.compile(r'"([^"\n]+)"')
_EM_RE = re.compile(r"(?<![\w*])\*(?!\s)(.+?)(?<!\s)\*(?![\w*])")


def _tex_code(text: str) -> str:
    """A code span: typewriter, with break points in long unbroken names (hashes, paths)."""
    escaped = tex(text)
    if len(text) > 16 and " " not in text:
        escaped = re.sub(r"((?:\\[a-z]+\{\}|\\.|[^\\]){8})", r"\1\\allowbreak{}", escaped)
    # T1 typewriter fonts join -- into an en dash: a command's --flag must print as typed
    return r"\texttt{" + re.sub("-(?=-)", "-{}", escaped) + "}"


def md_to_tex(text: str) -> str:
    """The Markdown subset the prose templates use (paragraphs, **bold**, *emphasis*, `code`,
    "quotes") as LaTeX: everything else is escaped, so a value can never inject TeX. Code spans
    are set aside first (as NUL-delimited indices), so bold and emphasis may enclose them."""
    codes: list[str] = []

    def aside(m: re.Match) -> str:
        codes.append(_tex_code(m.group(1)))
        return f"\0{len(codes) - 1}\0"

    out = tex(_CODE_RE.sub(aside, text))
    out = _BOLD_RE.sub(r"\\textbf{\1}", out)
    out = _EM_RE.sub(r"\\emph{\1}", out)
    out = _QUOTE_RE.sub(r"``\1''", out)  # "quoted" prose: TeX's opening and closing quotes
    return re.sub("\0(\\d+)\0", lambda m: codes[int(m.group(1))], out)


def tex_name(value) -> str:
    """A name (technique, function) escaped, breakable after its underscores: in a narrow
    paragraph column `flash_gradcp_chunked` would otherwise run into the next column."""
    return tex(value).replace(r"\_", r"\_\allowbreak{}")


# Search keys added since some studies ran: the field their searches record, and what the key
# says for searches without it (they ran as that value would).
SEARCH_KEYS_SINCE = {
    "allocator_slack_mib": ("allocator_slack_mib", 0),
    "from_plan": ("plan_batch", False),
}


def config_yaml(config: dict, searches: list[dict] = ()) -> str:
    """The study config as the paper prints it: YAML in the config's own order, credentials in
    URLs redacted (memopt.redact), ASCII only (other characters as YAML escapes). A search key
    added after the study's searches ran (SEARCH_KEYS_SINCE) says what they ran with, not the
    default they never used. A technique lists only the knobs it sets away from their defaults
    (memopt.knobs: every technique repeated all of them, pages of YAML)."""
    for key, (field, before) in SEARCH_KEYS_SINCE.items():
        if searches and all(field not in s for s in searches) and "search" in config:
            config = {**config, "search": {**config["search"], key: before}}
    if isinstance(config.get("techniques"), dict):
        d = defaults()
        config = {**config, "techniques": {
            name: {k: v for k, v in spec.items() if k not in d or v != d[k]}
            for name, spec in config["techniques"].items()}}  # fmt: skip
    return yaml.safe_dump(redact(config), sort_keys=False, allow_unicode=False).rstrip()


LISTING_CHARS = 84  # \small typewriter characters on the paper's line (2.5 cm margins)


def tex_listing(text: str, width: int = LISTING_CHARS) -> str:
    """Text set line by line in typewriter type, every character escaped: unlike a verbatim
    environment, no text can end it (a config string holding \\end{verbatim}\\input{FILE}
    would otherwise make LaTeX read FILE into the PDF). A line longer than `width` goes on
    under its indentation, so nothing runs off the page."""
    lines = []
    for line in str(text).split("\n"):
        indent = min(len(line) - len(line.lstrip(" ")) + 2, width // 2)
        while len(line) > width:
            lines.append(line[:width])
            line = " " * indent + line[width:]
        lines.append(line)
    # \mbox{} first: TeX drops the glue at the start of a line, indentation included.
    typeset = [r"\mbox{}" + tex(line).replace(" ", "~") for line in lines]
    return "\\par{\\ttfamily\\small\\noindent\n" + "\\\\\n".join(typeset) + "\\par}"


def md_code(text: str, lang: str = "") -> str:
    """A fenced Markdown code block whose fence is longer than any run of backticks in the text,
    so the text cannot close it."""
    runs = [len(r) for r in re.findall("`+", str(text))]
    fence = "`" * max(3, max(runs, default=0) + 1)
    return f"{fence}{lang}\n{text}\n{fence}"


def md(value) -> str:
    """Make a value safe inside a Markdown table cell: | would start a new column."""
    return "n/a" if value is None else str(value).replace("|", r"\|").replace("\n", " ")


def make_environment(templates_dir: Path, latex: bool) -> jinja2.Environment:
    """Jinja2 environment; LaTeX templates use \\BLOCK{..} \\VAR{..} \\#{..} since { } % are TeX."""
    options = dict(
        loader=jinja2.FileSystemLoader(str(templates_dir)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    if latex:
        options.update(
            block_start_string=r"\BLOCK{",
            block_end_string="}",
            variable_start_string=r"\VAR{",
            variable_end_string="}",
            comment_start_string=r"\#{",
            comment_end_string="}",
            line_statement_prefix=None,
            line_comment_prefix=None,
        )
    env = jinja2.Environment(**options)
    env.filters.update(
        num=num, pct=pct, sig=sig, mib=mib, mparams=mparams, tex=tex, tex_name=tex_name, md=md, md_code=md_code,
        tex_listing=tex_listing, code=lambda v: f"`{v}`", host_budget=host_budget_words,
    )  # fmt: skip
    return env


def host_budget_words(config: dict) -> str:
    """Where an offloading search's pinned host memory budget comes from, in the paper's words."""
    if config["search"].get("host_pinned_gib") is not None:
        return "search.host_pinned_gib, the same on every host"
    return "half the host's memory over its GPUs"


def tex_engine() -> list[str] | None:
    """The command that turns the .tex into a PDF here, or None when no TeX engine is installed."""
    if shutil.which("latexmk"):
        return ["latexmk", "-pdf", "-interaction=nonstopmode", "-halt-on-error"]
    if shutil.which("pdflatex"):
        return ["pdflatex", "-interaction=nonstopmode", "-halt-on-error"]
    return None


def build_pdf(tex_path: Path, pdf_out: Path) -> None:
    """Compile the paper's .tex (figures are found relative to it); auxiliary files stay in a
    temporary folder, so only the PDF lands beside the paper."""
    engine = tex_engine()
    if engine is None:
        raise MemoptError(
            "no TeX engine found (latexmk or pdflatex), so paper.pdf cannot be built; "
            "paper.md and paper.tex are complete without it. Install one, e.g. "
            "apt-get install texlive-latex-recommended texlive-latex-extra"
        )
    tex_path = Path(tex_path).resolve()
    with tempfile.TemporaryDirectory() as build:
        # pdflatex needs a second pass for references; latexmk decides by itself.
        for _ in range(1 if engine[0] == "latexmk" else 2):
            proc = subprocess.run(
                [*engine, f"-output-directory={build}", tex_path.name],
                cwd=tex_path.parent,
                capture_output=True,
                text=True,
                timeout=300,
            )
            if proc.returncode != 0:
                raise MemoptError(f"{engine[0]} failed on {tex_path}:\n{proc.stdout[-3000:]}")
        with atomic_path(pdf_out) as tmp:
            shutil.move(Path(build) / tex_path.with_suffix(".pdf").name, tmp)
