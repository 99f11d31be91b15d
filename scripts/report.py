#!/usr/bin/env python
"""Write eval/*.md and the generated blocks of README.md and the site's pages (docs/) from
the committed result JSON in eval/results/. Every figure in those documents comes from here;
prose in the templates (eval/templates/) states judgements, not measurements.

python scripts/report.py            # rewrite the documents
python scripts/report.py --check    # exit 1 if a document differs from what the JSON gives

Each JSON is written by the command quoted next to its table in the documents. Each document's
values come from its own module beside this one (report_results.py, report_ctr.py, ...; shared
helpers in report_common.py); this file reads the JSON and writes or checks the documents.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the document modules beside it

import report_common  # noqa: E402
from report_catalog import catalog_block, catalog_values  # noqa: E402
from report_common import CLAIMS, fill_blocks, render  # noqa: E402
from report_ctr import ctr_values, ope_values  # noqa: E402
from report_deploy import SCENARIOS, scenario_block
from report_hyper import (  # noqa: E402
    figure8_values,
    hyper_seeds_values,
    hyper_values,
    stability_values,
)
from report_performance import (  # noqa: E402
    TARGETS,  # noqa: E402, F401 (read by the tests)
    busy_values,
    perf_values,
    round_values,
)
from report_privacy import (  # noqa: E402
    device_cost_values,
    flower_secagg_values,
    mutants_values,
    population_values,
    privacy_values,
    secagg_auto_values,
    secagg_cost_values,
    secagg_fit_values,
    secagg_precision_values,
    secagg_words_values,
)
from report_ranking import cold_start_values, ranking_large_values, ranking_values  # noqa: E402
from report_readme import (  # noqa: E402
    architecture_block,
    cli_block,
    flower_block,
    grid_block,
    install_block,
    layout_block,
    readme_blocks,
    reproduce_block,
    suite_block,
    tune_block,
)
from report_results import budget_selections, budget_values, results_values  # noqa: E402, F401
from report_scale import limits_values, scale_summary, scale_values  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "eval" / "results"
TEMPLATES = ROOT / "eval" / "templates"

MISSING: list[str] = []  # result files a document asked for and did not find


def load(name):
    """A committed result, or None (the document then says "not measured yet", and --check
    fails: every document's evidence must be in the repository)."""
    path = RESULTS / name
    if not path.exists():
        MISSING.append(name)
        return None
    return json.loads(path.read_text())


report_common.set_loader(lambda name: load(name))  # the sections read through ``load`` too


def documents() -> dict[Path, str]:
    paper, cold = load("movielens_paper.json"), load("movielens_paper_cold.json")
    random_rows, tuned, scale = load("movielens_random.json"), load("movielens_tuned.json"), \
        load("scale.json")
    sweeps = {k: load(f"sweep_{k}.json") for k in ("recon-steps", "update-steps",
                                                   "server-optimizer")}
    ctr, impl, pop, bench = load("ctr.json"), load("implicit.json"), load("population.json"), \
        load("bench.json")
    privacy = load("privacy.json")
    t = {n: (TEMPLATES / f"{n}.md").read_text()
         for n in ("RESULTS", "CTR", "PERFORMANCE", "PRIVACY")}
    return {
        ROOT / "eval" / "RESULTS.md": render(t["RESULTS"], {**results_values(
            paper, cold, tuned, sweeps, scale, random_rows), **budget_values(load("budget.json"))}),
        ROOT / "eval" / "CTR.md": render(t["CTR"], {**ctr_values(ctr, impl, pop),
                                                   **ope_values(load("ope.json"))}),
        ROOT / "eval" / "PERFORMANCE.md": render(t["PERFORMANCE"], {
            **perf_values(bench, load("busy.json"), load("round.json")),
            **busy_values(load("busy.json")),
            **round_values(load("round.json"))}),
        **({ROOT / "eval" / "HYPER.md": render((TEMPLATES / "HYPER.md").read_text(),
                                                {**hyper_values(load("hyper.json"),
                                                                load("hyper_1m.json")),
                                                 **stability_values(
                                                     load("hyper_stability.json")),
                                                 **hyper_seeds_values(load("hyper_seeds.json")),
                                                 **hyper_seeds_values(
                                                     load("hyper_1m_seeds.json"), "m1_",
                                                     "hyper_1m_seeds.json"),
                                                 **figure8_values(
                                                     load("learned_weighting.json"))})}
           if load("hyper.json") else {}),
        **({ROOT / "eval" / "PRIVACY.md": render(t["PRIVACY"], {
            **privacy_values(privacy), **population_values(load("privacy_population.json")),
            **secagg_cost_values(load("secagg_cost.json")),
            **secagg_auto_values(),
            **secagg_words_values(),
            **secagg_precision_values(load("secagg_precision.json")),
            **secagg_fit_values(load("secagg_fit.json")),
            **flower_secagg_values(load("flower_deploy_secagg.json"),
                                   load("flower_deploy_warm.json")),
            **device_cost_values(load("device_cost.json")),
            **mutants_values(load("mutants.json"))})}
           if privacy else {}),
        **({ROOT / "eval" / "CATALOG.md": render((TEMPLATES / "CATALOG.md").read_text(),
                                                  catalog_values(load("out_of_catalog.json")))}
           if load("out_of_catalog.json") else {}),
        **({ROOT / "eval" / "RANKING.md": render((TEMPLATES / "RANKING.md").read_text(),
                                                  {**ranking_values(load("ranking.json"),
                                                                    load("ranking_published.json")),
                                                   **ranking_large_values(load("ranking_1m.json")),
                                                   **cold_start_values(load("cold_start.json"))})}
           if load("ranking.json") else {}),
        **({ROOT / "eval" / "SCALE.md": render((TEMPLATES / "SCALE.md").read_text(),
                                                {**scale_values(load("ray_scale.json")),
                                                 **limits_values(load("scale_limits.json"))})}
           if load("ray_scale.json") else {}),
        **filled_pages({
            **readme_blocks(paper, cold, random_rows, impl, ctr, bench),
            "tune": tune_block(tuned), "cli": cli_block(load("cli_session.json")),
            "architecture": architecture_block(),  # drawn from the code
            "reproduce": reproduce_block(RESULTS),
            "layout": layout_block(ROOT),
            **({"install": install_block(load("install.json"))} if load("install.json")
               else {}),
            "suite": suite_block(load("suite.json")),
            **({"grid": grid_block(load("grid_search.json"))} if load("grid_search.json")
               else {}),
            **({"ray": scale_summary(load("ray_scale.json"))} if load("ray_scale.json")
               else {}),
            **({"flower": flower_block(load("flower.json"), load("flower_deploy.json"),
                                       load("flower_deploy_devices.json"),
                                       load("flower_deploy_warm.json"))}
               if load("flower.json") else {}),
            **({"catalog": catalog_block(load("out_of_catalog.json"))}
               if load("out_of_catalog.json") else {}),
            "flower_scenarios": scenario_block(
                {n: load(f"flower_scenario_{n}.json") for n in SCENARIOS})}),
    }


def filled_pages(blocks: dict) -> dict[Path, str]:
    """README.md and every page of the site (docs/**/*.md) with generated blocks, filled."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return {p: fill_blocks(p.read_text(), blocks) for p in pages
            if "<!-- begin generated:" in p.read_text() and "_build" not in p.parts}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true",
                    help="compare instead of writing; exit 1 when a document is out of date "
                         "(either way, exit 1 when a comparison its prose states is false)")
    args = ap.parse_args(argv)
    stale = []
    CLAIMS.clear()
    MISSING.clear()
    try:
        docs = documents()
    except Exception:  # a document that cannot be built without a missing result
        if not MISSING:
            raise
        print("result files missing from eval/results (the documents cannot be built; rerun "
              "the script that writes each): " + ", ".join(sorted(set(MISSING))))
        return 1
    for path, text in docs.items():
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path.relative_to(ROOT)))
        else:
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    false = [f"{doc}: {text}" for doc, text, holds in CLAIMS if not holds]
    if false:
        print("the prose states comparisons the results no longer bear out (reword the "
              "template):\n  " + "\n  ".join(false))
    if stale:
        print("out of date (run python scripts/report.py): " + ", ".join(stale))
    missing = sorted(set(MISSING))
    if missing:
        print("result files missing from eval/results (their documents cannot be checked; "
              "rerun the script that writes each): " + ", ".join(missing))
    return 1 if stale or false or (args.check and missing) else 0


if __name__ == "__main__":
    from fedcf.cli import run_script

    run_script(lambda: main() == 0, "report.py", strict=True)
