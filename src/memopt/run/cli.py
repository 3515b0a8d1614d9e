"""`memopt`: the workflow's steps without Snakemake. Each subcommand calls the same function as
the rule of the same name."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import yaml

from memopt.config import load_config_file, validate_config
from memopt.errors import MemoptError, exit_on_user_error
from memopt.plan.report import GPUS as PLAN_GPUS  # torch-free

ROOT = Path(__file__).resolve().parents[3]


def _study(args) -> dict:
    return validate_config(load_config_file(args.config))


def cmd_validate(args) -> None:
    study = _study(args)
    if args.show:
        print(yaml.safe_dump(study, sort_keys=False, allow_unicode=True), end="")
        return
    print(
        f"{args.config}: valid (study {study['study']!r}, {len(study['techniques'])} techniques, "
        f"device {study['device']}); --show prints it with every default filled"
    )


def cmd_plan(args) -> None:
    from memopt.plan.report import format_plan, gpu_memory_mib, plan

    study = _study(args)
    if (args.gpu_memory is None) == (not args.cpu):
        raise MemoptError("memopt plan: give --gpu-memory SIZE (a GPU) or --cpu (a CPU search), "
                          "one of them")  # fmt: skip
    total = gpu_memory_mib(args.gpu_memory) if args.gpu_memory is not None else None
    gib = study["search"]["host_pinned_gib"]  # what offloading may pin: the study's budget,
    host = None if gib is None else gib * 1024
    if host is None and args.host_memory:  # else memopt.runtime.offload's share of the host
        from memopt.runtime.offload import HOST_FRACTION

        host = HOST_FRACTION * gpu_memory_mib(args.host_memory) / args.gpus_per_host
    vocab = study["tokenizer"]["vocab_size"]
    gpu = args.speed_gpu or (args.gpu_memory if args.gpu_memory in PLAN_GPUS else "H100-80GB")
    print(format_plan(plan(study, total, vocab, host, gpu), args.batch))
    print(
        f"\n{study['model'].get('arch', 'gpt2')} model, {study['model']['seq_len']:,} tokens a "
        f"sequence, vocabulary {vocab:,}; a prediction, not a measurement: `memopt search` proves "
        "a maximum. Offloaded techniques: " + (
            "the host's pinned memory checked." if host else "the host's memory not checked "
            "(--host-memory)."
        )
    )  # fmt: skip


def _training_study(args) -> dict:
    """The study for `memopt search` / `cell`: its device must be here (said in this command's
    terms), and the output is not a file the workflow made unless --force says to replace it."""
    from memopt.errors import MemoptError

    if args.out is None:  # the workflow's path for this result
        name = "search" if args.command == "search" else f"cells/{args.technique}"
        leaf = args.technique if args.command == "search" else args.batch
        args.out = Path("results") / name / f"{leaf}.json"
    study = _study(args)
    if study["device"] == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise MemoptError(
                f"{args.config}: device 'cuda', but this machine has no CUDA GPU that torch can "
                f"use; on a CPU, pass a config whose device is 'auto' or 'cpu', e.g. "
                f"memopt {args.command} ... --config config/smoke.yaml"
            )
    if args.out.exists() and not args.force:
        raise MemoptError(
            f"--out {args.out} exists (a result of the workflow, when it is the default path: "
            "replacing it by hand makes Snakemake rerun what depends on it); pass --out FILE to "
            "write elsewhere, or --force to replace it"
        )
    return study


def cmd_search(args) -> None:
    from memopt.jobs.pipeline import search_file

    study = _training_study(args)
    out = args.out
    r = search_file(study, args.technique, args.tokens, out, threads=args.threads)
    print(
        f"{args.technique}: max batch {r['max_batch']} ({r['status']}, {len(r['trials'])} "
        f"trials, {r['seconds']:.1f} s) -> {out}"
    )


def cmd_cell(args) -> None:
    from memopt.jobs.pipeline import cell_file

    study = _training_study(args)
    out = args.out
    r = cell_file(
        study,
        args.technique,
        args.batch,
        args.tokens,
        args.search_dir,
        out,
        threads=args.threads,
    )
    if r["status"] == "ok":
        print(
            f"{args.technique} batch {r['batch_size']}: {r['step_time_ms']['mean']:.1f} ms/step, "
            f"± {100 * (r['step_time_ms']['rel_ci95'] or 0):.1f}% ({r['timed_steps']} timed), "
            f"{r['tokens_per_s']:.0f} tokens/s, peak {r['peak_allocated_mib']:.0f} MiB -> {out}"
        )
    else:
        print(f"{args.technique} batch {r['batch_size']}: {r['status']} ({r['error']}) -> {out}")


def cmd_paper(args) -> None:
    from memopt.report.figures import make_figures
    from memopt.report.paper import render_paper
    from memopt.report.results import aggregate
    from memopt.report.stages import stage_benchmarks
    from memopt.report.verdicts import aggregate_quality
    from memopt.runtime.functions import functions

    results, out = Path(args.results), Path(args.out)
    study = _study(args)
    if study["map"]:  # a map study: its table, findings, figures and paper
        from memopt.report.map_paper import map_paper_from_results

        map_paper_from_results(study, results, Path(args.data), out, Path(args.templates))
        _wrote(out, args.pdf)
        return
    cells = [
        results / "cells" / t / f"{b}.json"
        for t in study["techniques"]
        for b in study["batch_sizes"]
    ]
    seeds = [study["train"]["seed"] + i for i in range(study["quality"]["seeds"])]
    runs = [
        results / "quality" / f / f"{s}.json" for f in functions(study["techniques"]) for s in seeds
    ]
    exact = [results / "exactness" / f"{t}.json" for t in study["techniques"]]
    missing = [str(c) for c in cells + runs + exact if not c.exists()]
    if missing:
        from memopt.errors import MemoptError

        raise MemoptError(
            f"{len(missing)} result(s) missing under {results}: "
            + ", ".join(missing[:5])
            + f"\n(memopt paper expects the techniques, batch entries and seeds of --config "
            f"{args.config}: is that the config these results were made with? For a study run "
            "through a profile, pass its config and folder, e.g. --config config/smoke.yaml "
            "--results runs/smoke/results --data runs/smoke/data --out runs/smoke/paper)"
        )
    summary = results / "summary.csv"
    searches = sorted((results / "search").glob("*.json"))
    aggregate(cells, summary)
    aggregate_quality(runs, results / "quality.csv")
    make_figures(
        summary,
        out / "figures",
        search_paths=searches,
        quality_paths=runs,
        baseline=study["baseline"],
        margin=study["quality"]["margin"],
        processes=os.cpu_count() or 1,
    )
    render_paper(
        summary,
        searches,
        Path(args.data) / "corpus" / "stats.json",
        Path(args.data) / "tokens" / "meta.json",
        study,
        out / "figures",
        Path(args.templates),
        out / "paper.md",
        out / "paper.tex",
        benchmark_paths=stage_benchmarks(results / "benchmarks"),
        reference_path=Path(args.templates).parent / "reference.yaml",
        quality_csv=results / "quality.csv",
        exactness_paths=exact,
    )
    _wrote(out, args.pdf)


def _wrote(out: Path, pdf: bool) -> None:
    print(f"wrote {out / 'paper.md'} and {out / 'paper.tex'}")
    if pdf:
        from memopt.report.paper_format import build_pdf

        build_pdf(out / "paper.tex", out / "paper.pdf")
        print(f"wrote {out / 'paper.pdf'}")


def cmd_unlock(args) -> None:
    from memopt.errors import MemoptError
    from memopt.run.processes import wait_for_study_processes

    folder = args.folder.resolve()
    if not folder.is_dir():
        raise MemoptError(f"folder: {args.folder} is not a directory")
    locks = folder / ".snakemake" / "locks"
    if not any(locks.glob("*")):
        print(f"memopt: nothing to unlock in {folder} (no Snakemake lock)")
        return
    running = wait_for_study_processes(folder, args.wait)
    if running:
        raise MemoptError(
            f"not unlocking {folder}: a Snakemake run or its jobs still run for it after "
            f"{args.wait:g} s:\n"
            + "\n".join(
                f"  pid {pid}: {cmd[:150]}" if isinstance(pid, int) else f"  SLURM job {pid}: {cmd}"
                for pid, cmd in running
            )
            + "\nwait for them to end, or stop them (kill PID, scancel JOBID), then run memopt "
            "unlock again"
        )
    for lock in locks.glob("*"):
        lock.unlink()
    print(f"memopt: removed the Snakemake lock of {folder} (no Snakemake or job runs there)")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed; allowed: an integer >= 1")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="memopt", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    fmt = argparse.ArgumentDefaultsHelpFormatter  # every option's default in its --help

    def add(name, func, help_, description=None):
        sp = sub.add_parser(name, help=help_, description=description or help_, formatter_class=fmt)
        sp.set_defaults(func=func)
        return sp

    def add_config(sp):
        sp.add_argument("--config", type=Path, default=Path("config.yaml"), help="study config")

    sp = add("validate", cmd_validate, "check a study config (one line; --show prints it)")
    add_config(sp)
    sp.add_argument(
        "--show", action="store_true", help="print the config with every default filled (YAML)"
    )
    for name, func, help_ in (
        ("search", cmd_search, "find one technique's maximum batch"),
        ("cell", cmd_cell, "train one technique at one batch entry"),
    ):
        sp = add(name, func, help_)
        sp.add_argument("technique", help="a technique of the config")
        if name == "cell":
            sp.add_argument("batch", help="same, max, or a number")
        add_config(sp)
        sp.add_argument("--tokens", type=Path, default=Path("data/tokens"), help="token folder")
        sp.add_argument(
            "--threads",
            type=_positive_int,
            default=None,
            help="CPU threads for torch; None: all cores",
        )
        default_out = (
            "results/search/TECHNIQUE.json"
            if name == "search"
            else "results/cells/TECHNIQUE/BATCH.json"
        )
        sp.add_argument(
            "--out", type=Path, default=None,
            help=f"result file; None: {default_out} (the workflow's), refused if it exists",
        )  # fmt: skip
        sp.add_argument("--force", action="store_true", help="replace --out if it exists")
        if name == "cell":
            sp.add_argument(
                "--search-dir", type=Path, default=Path("results/search"),
                help="where the searches behind `same` and `max` are",
            )  # fmt: skip
    sp = add(
        "plan", cmd_plan,
        "predict each technique's peak memory and largest batch on a GPU, without one",
    )  # fmt: skip
    add_config(sp)
    sp.add_argument(
        "--gpu-memory", default=None,
        help="the GPU's memory: a size (24GiB, 40GB, 81559MiB) or a name (H100-80GB, H200)",
    )  # fmt: skip
    sp.add_argument(
        "--cpu", action="store_true",
        help="predict a CPU search instead (its search.cpu_memory_budget_gib of tensors)",
    )  # fmt: skip
    sp.add_argument("--batch", type=_positive_int, default=8, help="the batch of the peak column")
    sp.add_argument(
        "--host-memory", default=None,
        help="the host's memory (a size): offloaded techniques may pin a share of it, unless "
        "the study sets search.host_pinned_gib; None: not checked",
    )  # fmt: skip
    sp.add_argument("--gpus-per-host", type=_positive_int, default=1, help="GPUs sharing it")
    sp.add_argument(
        "--speed-gpu", choices=tuple(PLAN_GPUS), default=None,
        help="whose measured cells predict tokens/s (default: the --gpu-memory name, else "
        "H100-80GB)",
    )  # fmt: skip
    sp = add("paper", cmd_paper, "aggregate a results folder and render the paper (no GPU needed)")
    add_config(sp)
    sp.add_argument("--results", default="results", help="folder with cells/ and search/")
    sp.add_argument(
        "--data", default="data", help="folder with corpus/stats.json, tokens/meta.json"
    )
    sp.add_argument("--out", default="paper", help="where paper.md, paper.tex, figures/ go")
    sp.add_argument(
        "--templates", default=str(ROOT / "paper" / "templates"), help="Jinja2 templates"
    )
    sp.add_argument("--pdf", action="store_true", help="also compile paper.pdf (needs TeX)")
    sp = add(
        "unlock",
        cmd_unlock,
        "remove the Snakemake lock a killed run left in a folder, once nothing runs there",
        "After kill -9 (or a crash) Snakemake leaves its lock on the study's folder. This removes "
        "it only when no Snakemake run and none of its jobs is still running in the folder, nor "
        "any SLURM job Snakemake submitted from it (squeue): an orphaned job would otherwise race "
        "the next run.",
    )
    sp.add_argument(
        "folder", nargs="?", type=Path, default=Path("."),
        help="the study's folder (runs/smoke for the smoke study)",
    )  # fmt: skip
    sp.add_argument(
        "--wait", type=float, default=15.0, help="seconds to wait for jobs that are stopping"
    )
    return p


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    with exit_on_user_error():
        args.func(args)


if __name__ == "__main__":
    main()
