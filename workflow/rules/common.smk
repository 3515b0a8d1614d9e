# Config: config.yaml unless --configfile names another study; validated before the DAG is built.
import os
import sys
from pathlib import Path

# The rules track this checkout's src/ as their code inputs, so this process and every job import
# memopt from it, whatever else is installed (memopt.run.closure.jobs_import_from).
sys.path.insert(0, str(Path(workflow.basedir).resolve() / "src"))
from memopt.run.closure import code_inputs, jobs_import_from

jobs_import_from(Path(workflow.basedir) / "src")
from memopt.config import Params, empty_overrides, validate_config
from memopt.map_points import map_points, map_reference, point_models, point_study
from memopt.errors import ConfigError
from memopt.runtime.functions import functions, quality_spec, reference_technique
from memopt.report.paper_format import tex_engine
from memopt.report.map_results import MAP_FIGURE_NAMES
from memopt.report.results import FIGURE_NAMES
from memopt.report.stages import RULE_STAGES
from memopt.run.study_run import check_device_here, check_folder, claim_folder


if not workflow.overwrite_configfiles:

    configfile: Path(workflow.basedir) / "config.yaml"


try:
    if empty := empty_overrides(dict(workflow.config_settings.config)):  # --config alone
        raise ConfigError(
            "\n".join(
                f"--config {key}={{}}: Snakemake merges --config into the config key by key, so "
                "an empty mapping changes nothing; allowed: the keys to change (e.g. "
                "techniques={'flash': {'window': 64}}), or a config file with --configfile"
                for key in empty
            )
        )
    STUDY = validate_config(config)
except ConfigError as err:
    sys.exit(f"memopt: invalid config:\n{err}")
try:
    check_folder(STUDY["study"], Path.cwd())  # another study's outputs are never touched
except ConfigError as err:
    sys.exit(f"memopt: {err}")

ROOT = Path(os.path.relpath(workflow.basedir))  # relative: recorded inputs survive a moved checkout


def corpus_params():
    """The corpus config, a local mirror's relative path taken from the repository (the folder
    of this Snakefile): the same mirror whichever folder the study writes to."""
    corpus = dict(STUDY["corpus"])
    mirror = corpus.get("mirror")
    if mirror and "://" not in mirror and not os.path.isabs(mirror):
        corpus["mirror"] = os.path.normpath(ROOT / mirror)
    return Params(corpus)

TECHNIQUES = list(STUDY["techniques"])
BATCHES = [str(b) for b in STUDY["batch_sizes"]]
CELLS = expand("results/cells/{technique}/{batch}.json", technique=TECHNIQUES, batch=BATCHES)
SEARCHES = expand("results/search/{technique}.json", technique=TECHNIQUES)
EXACTNESS = expand("results/exactness/{technique}.json", technique=TECHNIQUES)
# Quality runs: one per distinct function (memopt.runtime.functions) and seed.
FUNCTIONS = functions(STUDY["techniques"])
SEEDS = [STUDY["train"]["seed"] + i for i in range(STUDY["quality"]["seeds"])]
QUALITY = expand("results/quality/{function}/{seed}.json", function=list(FUNCTIONS), seed=SEEDS)
FIGURES = expand("paper/figures/{name}.{ext}", name=FIGURE_NAMES, ext=["pdf", "png"])
PAPER = ["paper/paper.md", "paper/paper.tex"] + (["paper/paper.pdf"] if tex_engine() else [])
# Wall-clock per job of each stage (Snakemake `benchmark:`), summed per stage in the paper
# (memopt.report.stages.stage_times: rendering itself is not counted).
STAGE_BENCHMARKS = (
    expand("results/benchmarks/{rule}.tsv", rule=list(RULE_STAGES))
    + expand("results/benchmarks/search/{technique}.tsv", technique=TECHNIQUES)
    + expand("results/benchmarks/cell/{technique}/{batch}.tsv", technique=TECHNIQUES, batch=BATCHES)
    + expand("results/benchmarks/quality/{function}/{seed}.tsv", function=list(FUNCTIONS), seed=SEEDS)
)
TOKENS = multiext("data/tokens/", "train.bin", "val.bin", "meta.json")
# A map study's points (memopt.map_points): a search and a cell per point and technique.
MAP_POINTS = map_points(STUDY)
MAP_SEARCHES = expand(
    "results/map/{point}/search/{technique}.json", point=list(MAP_POINTS), technique=TECHNIQUES
)
MAP_CELLS = expand(
    "results/map/{point}/cells/{technique}/max.json", point=list(MAP_POINTS), technique=TECHNIQUES
)
MAP_REFERENCE = map_reference(STUDY)
MAP_FIGURES = expand("paper/figures/{name}.{ext}", name=MAP_FIGURE_NAMES, ext=["pdf", "png"])
PAPER_FIGURES = MAP_FIGURES if MAP_POINTS else FIGURES  # the figures the study's paper shows
CONDA_ENV = "../../envs/memopt.yaml"  # `--use-conda` runs every rule in it (relative to rules/)


# A summary, figure or paper lists techniques in the config's order (the params below compare
# mappings whatever their key order: memopt.config.Params).
TECHNIQUE_ORDER = TECHNIQUES


def code(script):
    """A rule's code inputs: the memopt sources its script can run (memopt.run.closure), so editing
    one reruns exactly the rules that import it."""
    return code_inputs(ROOT / "workflow" / "scripts" / f"{script}.py")


def without_eval(study):
    """The study as a timing job sees it: the train keys only quality runs read (their validation
    windows) left out, so that changing them reruns no search or cell."""
    train = {k: v for k, v in study["train"].items() if k not in ("eval_sequences", "eval_batch_size")}
    return {**study, "train": train}


def point_params(keys):
    """A map point's job sees the study with the point's model in place of the study's."""
    return lambda w: Params({k: without_eval(point_study(STUDY, w.point))[k] for k in keys})


def technique_spec(w):
    return Params(STUDY["techniques"][w.technique])


# What a training rule's result depends on besides its inputs: changing any of it reruns it.
TRAIN_RESOURCES = {"gpu": 1} | ({"gpu_model": STUDY["gpu_model"]} if STUDY["gpu_model"] else {})
# A search or cell of a parallel technique holds its `gpus` GPUs (memopt.runtime.parallel).
TECHNIQUE_RESOURCES = TRAIN_RESOURCES | {
    "gpu": lambda w: STUDY["techniques"][w.technique]["gpus"]
}
TRAIN_KEYS = ("device", "model", "train", "measure", "search", "baseline")
TIMING_STUDY = without_eval(STUDY)
TRAIN_PARAMS = Params({k: TIMING_STUDY[k] for k in TRAIN_KEYS})
# The exactness keys the runs read: floor_factor is the paper's, and with exactness.floor on only
# each function's reference trains a floor run (so only its search reruns).
EXACTNESS_RUNS = {k: v for k, v in STUDY["exactness"].items() if k not in ("floor", "floor_factor")}


def search_params(w):
    floor = STUDY["exactness"]["floor"]
    if floor != "none" and reference_technique(STUDY["techniques"], w.technique) == w.technique:
        return Params(TRAIN_PARAMS | {"exactness": EXACTNESS_RUNS | {"floor": floor}})
    return Params(TRAIN_PARAMS | {"exactness": EXACTNESS_RUNS})
QUALITY_PARAMS = Params(  # quality.margin is the paper's, not the runs': changing it reruns none
    {k: STUDY[k] for k in ("device", "model", "train", "measure", "search")}
    | {"quality": {k: v for k, v in STUDY["quality"].items() if k != "margin"}}
)


wildcard_constraints:
    technique="|".join(TECHNIQUES),
    point="|".join(MAP_POINTS) or "(?!)",  # (no map: matches nothing)
    batch="|".join(BATCHES),
    function="|".join(FUNCTIONS),
    seed=r"\d+",
