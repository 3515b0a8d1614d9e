"""memopt.report.paper_figrefs: the study paper's figures numbered in order and each referred to
from its section, in both formats."""

from memopt.report.paper_figrefs import number_figures

MD = """## 3 Results

![Memory against speed.](figures/tradeoff.png)

text

### Appendix: every timing cell

![Peak memory.](figures/memory.png)

![Throughput by batch.](figures/speed_batch.png)
"""
TEX = """\\section{Results}

\\VAR{figure}
\\section{Every timing cell}
"""


def test_captions_are_numbered_and_each_section_refers_to_its_figures():
    md, tex = number_figures(MD, TEX)
    assert "![Figure 1: Memory against speed.](figures/tradeoff.png)" in md
    assert "![Figure 3: Throughput by batch.](figures/speed_batch.png)" in md
    assert "## 3 Results\n\nThis section shows memory against speed (Figure 1).\n" in md
    assert ("### Appendix: every timing cell\n\nThis section shows peak memory per cell (Figure 2) "
            "and tokens/s against batch (Figure 3).\n") in md  # fmt: skip
    assert "\\section{Results}\n\nThis section shows memory against speed " \
           "(Figure~\\ref{fig:tradeoff}).\n" in tex  # fmt: skip
    assert (
        "(Figure~\\ref{fig:memory}) and tokens/s against batch (Figure~\\ref{fig:speed_batch})"
        in tex
    )


def test_a_paper_without_figures_is_left_as_it_is():
    assert number_figures("## 1 Intro\n\ntext\n", "\\section{Intro}\n") == (
        "## 1 Intro\n\ntext\n",
        "\\section{Intro}\n",
    )
