"""Replay the latency model and the candidate filter on a finished search: which of each round's winners it keeps.

    python -m bench.replay_filter WORK_DIR [WORK_DIR ...] [--round-size 16] [--filter-threshold 0.9]
                                  [--filter-keep 0.25] [--objective metaschedule,pairwise]

WORK_DIR is a single-task run of the engine alone (the Trimmer benchmark's engine arm on a
kernel): every proposal measured, in rounds of ``--round-size``, and its saved latency model
(``cost_model/``) holding every measurement it learned from, in the order of
``measurements.jsonl``. The model is trained again as the session trains it (MetaSchedule's
XGBoost model on its per-store features, retrained once its data has grown by a fifth) and
scores each round before the round's measurements join it; the filter's own rule
(``TrimmerFilter.partition``: what scores at or above the threshold, at least the keep share)
says which proposals it would have built. Per run: the rounds' winners (candidates that beat
the task's best by more than 1%) that the rule keeps, beside the share of proposals it keeps
(what keeping at random would catch); how often the model's top quarter holds the round's
fastest (a quarter by chance); the mean rank correlation. ``pairwise`` trains the same trees
on a pairwise logistic ranking loss in place of MetaSchedule's squared error on normalised
throughput, to see whether the loss, rather than the features, limits the ranking.

What a replay cannot show: the rounds a filtered search would have proposed instead (the
filter changes the search's path), and what the filter's exploration share buys back.
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from autotune.policies import COST_MODEL_DIR
from autotune.session import MEASUREMENTS_LOG
from cost_models.candidate_filter import TrimmerFilter
from cost_models.latency_model import DATA, SCORING_SAMPLES, training_groups
from cost_models.quality import RankQuality
from results.report import read_measurements

FAILED_COST = 1e10  # what MetaSchedule's model records for a candidate that did not run
MIN_GAIN = 0.01  # a winner beats its task's best by more than this (preemption's default gain)
PAIRWISE_ROUNDS = 100  # boosting rounds for the pairwise loss (MetaSchedule's own stops early on its training error)

Scorer = Callable[[list[np.ndarray]], np.ndarray]


@dataclass(frozen=True)
class FilterReplay:
    rounds: int  # rounds scored by a trained model
    proposals: int
    kept: int  # proposals the rule would have built
    winners: int
    winners_kept: int
    winners_in_top_quarter: int  # the rule at its floor alone, comparable across objectives
    fastest_in_top_quarter: int
    mean_tau: float | None


def load_run(work_dir: Path) -> tuple[list[np.ndarray], np.ndarray]:
    """Each measured candidate's per-store features and its cost, in the order they were measured.

    Raises:
        SystemExit: the folder holds no saved model, a model of several tasks, or one whose
            data does not follow its measurement log.
    """
    path = work_dir / COST_MODEL_DIR / DATA
    if not path.exists():
        raise SystemExit(f"{path} not found; expected a finished run's saved latency model")
    with np.load(path, allow_pickle=False) as data:
        groups = training_groups({k: data[k] for k in data.files})
    if len(groups) != 1:
        raise SystemExit(f"{path}: the model learned from {len(groups)} tasks; the replay takes a run of one task "
                         f"(the order across tasks is not saved)")
    (_, xs, costs), = groups
    logged = [m["latency_s"] for m in read_measurements(work_dir / MEASUREMENTS_LOG)]
    expected = np.array([FAILED_COST if v is None else v for v in logged])
    if len(expected) != len(costs) or not np.allclose(costs, expected, rtol=1e-5):
        raise SystemExit(f"{path} does not hold {work_dir / MEASUREMENTS_LOG}'s measurements in order; "
                         f"expected a run whose model started empty and measured every proposal")
    return xs, costs.astype(np.float64)


def normalised(costs: np.ndarray) -> np.ndarray:
    """Throughput as a share of the best so far (the model's label): 0 for a failed candidate."""
    return np.where(costs < FAILED_COST, costs.min() / costs, 0.0)


def metaschedule_scorer(xs: list[np.ndarray], ys: np.ndarray) -> Scorer:
    """MetaSchedule's own model trained on ``xs``: what the session's ``latency_model.score`` asks."""
    from cost_models.latency_model import create_latency_model

    model = create_latency_model(num_cores=2)._inst
    model._train(xs=xs, ys=ys)
    return lambda candidates: model._predict(xs=candidates)


def pairwise_scorer(xs: list[np.ndarray], ys: np.ndarray) -> Scorer:
    """The same trees and features on a pairwise logistic loss: every pair of candidates, the faster first."""
    import xgboost as xgb
    from tvm.s_tir.meta_schedule.cost_model.xgb_model import PackSum, XGBConfig

    train = PackSum(xs, None)  # MetaSchedule's layout: a row per store, a candidate's score the sum of its rows'
    pairs = (ys[:, None] > ys[None, :]).astype(np.float64)  # [i, j]: i was faster than j
    pairs *= len(xs) / max(pairs.sum(), 1.0)

    def objective(row_scores: np.ndarray, _: object) -> tuple[np.ndarray, np.ndarray]:
        s = train.predict_with_score(row_scores)
        slower_wins = 1.0 / (1.0 + np.exp(np.clip(s[:, None] - s[None, :], -50, 50)))  # sigma(s_j - s_i)
        g, h = pairs * slower_wins, pairs * slower_wins * (1 - slower_wins)
        grad, hess = g.sum(0) - g.sum(1), h.sum(0) + h.sum(1)
        return grad[train.ids], np.maximum(hess[train.ids], 1e-6)

    booster = xgb.train(XGBConfig().to_dict(), train.dmatrix, PAIRWISE_ROUNDS, obj=objective)

    def scorer(candidates: list[np.ndarray]) -> np.ndarray:
        test = PackSum(candidates, None)
        return test.predict_with_score(booster.predict(test.dmatrix))
    return scorer


OBJECTIVES: dict[str, Callable[[list[np.ndarray], np.ndarray], Scorer]] = {
    "metaschedule": metaschedule_scorer, "pairwise": pairwise_scorer}


def replay(xs: Sequence[np.ndarray], costs: np.ndarray, round_size: int,
           train: Callable[[list[np.ndarray], np.ndarray], Scorer], rule: TrimmerFilter) -> FilterReplay:
    """Score each round with the model trained on the rounds before it; count the winners ``rule`` keeps."""
    quality = RankQuality()
    rounds = proposals = kept = winners = winners_kept = winners_top = fastest_top = 0
    scorer, trained_on = None, 0
    for start in range(0, len(costs), round_size):
        if start >= SCORING_SAMPLES and (scorer is None or start - trained_on >= trained_on / 5):
            scorer, trained_on = train(list(xs[:start]), normalised(costs[:start])), start
        if scorer is None:
            continue
        best, chunk = costs[:start].min(), costs[start:start + round_size]
        scores = [float(v) for v in scorer(list(xs[start:start + round_size]))]
        keep = set(rule.partition(scores)[0])
        top_quarter = sorted(range(len(scores)), key=lambda i: -scores[i])[:max(1, len(scores) // 4)]
        won = [i for i, c in enumerate(chunk) if c < best * (1 - MIN_GAIN)]
        rounds += 1
        proposals += len(chunk)
        kept += len(keep)
        winners += len(won)
        winners_kept += sum(i in keep for i in won)
        winners_top += sum(i in top_quarter for i in won)
        fastest_top += int(int(np.argmin(chunk)) in top_quarter)
        quality.record("task", scores, [c if c < FAILED_COST else math.inf for c in chunk], trained=True)
    taus = [r["tau"] for r in quality.rounds if r["tau"] is not None]
    return FilterReplay(rounds, proposals, kept, winners, winners_kept, winners_top, fastest_top,
                        statistics.fmean(taus) if taus else None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("work_dirs", type=Path, nargs="+", help="single-task runs of the engine alone")
    parser.add_argument("--round-size", type=int, default=16)
    parser.add_argument("--filter-threshold", type=float, default=TrimmerFilter.threshold)
    parser.add_argument("--filter-keep", type=float, default=TrimmerFilter.keep_share)
    parser.add_argument("--objective", default="metaschedule", help=f"comma-separated: {', '.join(OBJECTIVES)}")
    args = parser.parse_args()
    if args.round_size < 1:
        raise SystemExit(f"--round-size must be a whole number of at least 1; got {args.round_size}")
    objectives = args.objective.split(",")
    if unknown := [o for o in objectives if o not in OBJECTIVES]:
        raise SystemExit(f"unknown --objective {', '.join(unknown)}; expected some of {', '.join(OBJECTIVES)}")
    try:
        rule = TrimmerFilter(threshold=args.filter_threshold, keep_share=args.filter_keep)
    except ValueError as err:
        raise SystemExit(str(err)) from None
    print(f"Rule: keep what scores >= {args.filter_threshold:g}, at least {args.filter_keep:.0%} of a round of {args.round_size}; "
          f"a winner beats the task's best by more than {MIN_GAIN:.0%}.\n")
    print("| run | objective | rounds | proposals kept | winners kept | winners in the top quarter "
          "| fastest in the top quarter | mean tau |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for work_dir in args.work_dirs:
        xs, costs = load_run(work_dir)
        for objective in objectives:
            r = replay(xs, costs, args.round_size, OBJECTIVES[objective], rule)
            if not r.rounds:
                raise SystemExit(f"{work_dir}: {len(costs)} measurements leave no round after the model's first "
                                 f"{SCORING_SAMPLES}; expected a longer run")
            tau = "-" if r.mean_tau is None else f"{r.mean_tau:.3f}"
            print(f"| {work_dir} | {objective} | {r.rounds} | {r.kept / r.proposals:.0%} ({r.kept} of {r.proposals}) | "
                  f"{r.winners_kept} of {r.winners} | {r.winners_in_top_quarter} of {r.winners} | "
                  f"{r.fastest_in_top_quarter} of {r.rounds} | {tau} |", flush=True)


if __name__ == "__main__":
    main()
