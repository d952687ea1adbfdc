"""Trimmer benchmark: what the candidate filter and preemption save, at what cost in model latency.

    python -m bench.trimmer [--workloads matmul512,conv3x3_resnet18,mlp,resnet18,bert_layer]
                            [--target cuda --arms engine,trimmer] [--resume] [--rerun [--seed N]]

Arms, each in its own process, one after another on the same machine, same budget:
  stock    MetaSchedule's tune_tir / tune_relax with a warm build pool (stock defaults build
           nothing here, see tuning.md), its runner timed for device-seconds
  engine   our session and parallel engine alone (no filter, no preemption)
  trimmer  the same with the candidate filter and preemption at their defaults
  preemption  the engine with preemption alone, only when --arms names it: what the filter adds
           shows against it
For zoo:resnet18 two more arms run the trimmer arm again warm-started from the first trimmer
run: trimmer_warm from its saved latency model alone, trimmer_warm_run from its run folder (the
saved model, and its database's best schedules leading each task's first round). Final
latencies (the kernel's best, or the compiled model) are re-measured side by side in turns. Results merge into
results/bench/trimmer.{json,md} by workload, so workloads can be run separately (a first run at
another budget keeps the runs it replaces, listed as earlier, and so does a run under
another preemption rule); a run on
another target (``--target cuda``: energy from NVML's counter) goes to trimmer_<target>.{json,md}.
Each arm's command and result are saved in its work folder; ``--resume`` keeps an arm the same
command finished, so that a killed run goes on from the arm it was in. ``--rerun --seed N`` adds a
run of our arms on another search seed; a table pools each workload's runs by budget and rule.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.remeasure import BLOCK, ratio_interval
from bench.tuning import ARM_RESULT, _run_json, saved_arm
from bench.tuning import run_arm as run_any_arm
from bench.workloads import WORKLOADS
from results.atomic import write_atomically
from cost_models.candidate_filter import TrimmerFilter
from cost_models.preemption import COUNTS

OUT_DIR = Path("results/bench")
# (trials, round size): the kernels 1000 trials and the MLP 1152 (24 rounds of each of its three tasks), long
# enough to reach their plateau in most runs: at 320 and 384 the engine arms were still gaining, so there was
# little to trim. BERT's 2304 trials reach its plateau: 10 of its 18 tasks have no tunable space and take one
# trial, and the four large matmuls got 193-728 trials each and made their last gain of more than 1% by their
# 114th-325th (engine arm, 48 min).
# ResNet-18's 2880 trials reach its plateau the same way: 19 of its 27 tasks take 1-17 trials, and the eight
# convolutions got 93-711 each, their last gains by their 41st-505th (engine arm 94 min, trimmer 46).
BUDGETS = {"matmul512": (1000, 16), "conv3x3_resnet18": (1000, 16), "mlp": (1152, 16), "resnet18": (2880, 8),
           "bert_layer": (2304, 8)}
WARM_WORKLOAD = "resnet18"
ARMS = ("stock", "engine", "trimmer", "preemption", "trimmer_warm", "trimmer_warm_run")
ABLATION = "preemption"  # the engine with preemption alone, asked for by --arms: what the filter adds shows against it
WARM_ARMS = {"trimmer_warm": ("warm_start", "the first trimmer run's saved latency model"),
             "trimmer_warm_run": ("warm_start_run", "the first trimmer run's folder: its saved model, and its "
                                  "database's best schedules leading each task's first round")}  # result key, from
TARGETS = {"device_s_saving": 0.40, "energy_saving": 0.40, "latency_ratio": 1.02, "drop_rate": 0.05}


@dataclass(frozen=True)
class GuidedRounds:
    """The filtering arms' rounds of model-guided search: how many rounds' proposals each brings (the filter's
    ``--filter-guided-pool``), how many generations it evolves (``--filter-guided-generations``) and from how
    large a population (``--filter-guided-population``)."""

    pool: float = TrimmerFilter.guided_pool
    generations: int = TrimmerFilter.guided_generations
    population: int = TrimmerFilter.guided_population

    @classmethod
    def of(cls, filter_report: dict[str, Any]) -> GuidedRounds:
        """What an arm's filter report says it ran (reports from before a setting existed ran its default)."""
        return cls(filter_report.get("guided_pool", cls.pool), filter_report.get("guided_generations", cls.generations),
                   filter_report.get("guided_population", cls.population))

    def flags(self) -> list[str]:
        """``bench.arms`` flags for the settings that are not the filter's defaults."""
        return [part for flag, value, _ in self._unlike_default() for part in (flag, value)]

    def clauses(self) -> str:
        """The same, as clauses of a rule's label."""
        return "".join(clause for _, _, clause in self._unlike_default())

    def _unlike_default(self) -> list[tuple[str, str, str]]:
        return [(flag, f"{value:g}", clause.format(value)) for flag, value, default, clause in (
            ("--guided-pool", self.pool, GuidedRounds.pool, ", guided rounds of {:g} rounds' proposals"),
            ("--guided-generations", self.generations, GuidedRounds.generations, ", guided rounds of {} generations"),
            ("--guided-population", self.population, GuidedRounds.population,
             ", guided rounds evolving {} schedules per candidate"))
            if value != default]


def bench_workload(name: str, work_root: Path, target: str = "cpu", chosen: Sequence[str] = ARMS,
                   trials: int | None = None, resume: bool = False, seed: int = 0,
                   counts: str = COUNTS[0], guided: GuidedRounds = GuidedRounds()) -> dict[str, Any]:
    """Run ``chosen`` arms on ``name`` (``resume``: keep arms a run of the same command finished), then compare.

    ``seed`` is our arms' search seed: the engine and trimmer arms of one run share it (a paired run).
    ``counts``: what the preempting arms' patience counts (proposals or measurements); ``guided``: the
    filtering arms' guided rounds.

    Returns {} when the engine or the trimmer arm is not among them: the arms run are only saved.
    """
    trials = trials or BUDGETS[name][0]
    arms: dict[str, Any] = {}
    for arm in ARMS:
        if arm not in chosen or (arm in WARM_ARMS and name != WARM_WORKLOAD):
            continue
        work_dir = work_root / name / arm
        arms[arm] = run_arm(work_dir, arm_command(name, arm, work_root, work_dir, trials, target, seed, counts,
                                                  guided), resume)
    if not {"engine", "trimmer"} <= set(arms):
        return {}  # one arm alone: saved for a later --resume run to compare
    dirs = {arm: str(work_root / name / arm / ("" if arm == "stock" else "ranked")) for arm in arms
            if "failure" not in arms[arm]}
    print(f"[{name}] re-measuring final latencies side by side ...", file=sys.stderr, flush=True)
    isolated, failure = _run_json(["bench.remeasure", "--target", target, name,
                                   *(f"{a}={d}" for a, d in dirs.items())], None)
    isolated = isolated or {"median": {}, "fastest": {}, "turns": {}}
    rows = {arm: _row(r, isolated["median"].get(arm), isolated["fastest"].get(arm)) for arm, r in arms.items()}
    turns = [isolated["turns"].get(arm) for arm in ("trimmer", "engine")]
    result = {"description": WORKLOADS[name].description, "trials": trials, "round_size": BUDGETS[name][1],
              "seed": seed, "retiming_turns": len(turns[0]) if all(turns) else None, "arms": rows,
              "trimmer_vs_engine": _compare(rows["engine"], rows["trimmer"],
                                            ratio_interval(*turns, block=BLOCK) if all(turns) else None)}
    if ABLATION in rows:
        alone = isolated["turns"].get(ABLATION)
        interval = ratio_interval(alone, turns[1], block=BLOCK) if alone and turns[1] else None
        result["preemption_vs_engine"] = _compare(rows["engine"], rows[ABLATION], interval)
    for arm, (key, _) in WARM_ARMS.items():
        if arm in arms:
            result[key] = _warm(arms["trimmer"], arms[arm])
    if failure:
        result["remeasure_failure"] = failure
    return result


def arm_command(name: str, arm: str, work_root: Path, work_dir: Path, trials: int, target: str,
                seed: int, counts: str = COUNTS[0], guided: GuidedRounds = GuidedRounds()) -> list[str]:
    """The ``bench.arms`` command line of ``arm`` on workload ``name`` (warm arms start from ``work_root``'s
    trimmer run); ``seed`` 0 is the engine's default search seed, ``counts`` the default patience's unit,
    ``guided`` the filtering arms' guided rounds."""
    first = work_root / name / "trimmer"
    args = {"stock": ["warm_stock"], "engine": ["autotune", "--policies", "off"],
            "trimmer": ["autotune", "--policies", "trimmer"], "preemption": ["autotune", "--policies", "preemption"],
            "trimmer_warm": ["autotune", "--policies", "trimmer", "--warm-start", str(first / "cost_model")],
            "trimmer_warm_run": ["autotune", "--policies", "trimmer", "--warm-start", str(first)]}[arm]
    return ["bench.arms", args[0], name, str(trials), str(work_dir), *args[1:], "--round-size",
            str(BUDGETS[name][1]), "--target", target, *(["--seed", str(seed)] if seed else []),
            *(["--patience-counts", counts] if counts != COUNTS[0] and arm not in ("engine", "stock") else []),
            *(guided.flags() if arm.startswith("trimmer") else [])]


def run_arm(work_dir: Path, command: list[str], resume: bool) -> dict[str, Any]:
    """``bench.tuning.run_arm``, keeping a saved preempting arm only where it ran the default rule."""
    return run_any_arm(work_dir, command, resume, saved=_saved_arm)


def _saved_arm(work_dir: Path, command: list[str]) -> dict[str, Any] | None:
    """The result an earlier run of ``command`` left in ``work_dir``, or None.

    A trimmer arm runs the default preemption (in the unit its command names), which its command does
    not spell out: one that ran under another rule (as a job of one task or of several applies it) is not kept.
    """
    from autotune.policies import PolicySettings

    saved = saved_arm(work_dir, command)
    if saved is None:
        return None
    rule = saved.get("policies", {}).get("preemption", {}).get("rule")
    trimmed = "trimmer" in command or "preemption" in command
    counts = command[command.index("--patience-counts") + 1] if "--patience-counts" in command else COUNTS[0]
    policy = PolicySettings(patience_counts=counts).preemption_policy()
    return None if trimmed and rule not in (policy.rule_for(1), policy.rule_for(2)) else saved


def _row(arm: dict[str, Any], final_s: float | None, fastest_s: float | None) -> dict[str, Any]:
    """The figures the issue asks for, per arm; ``fastest_s``: its quietest re-timing, beside the median ``final_s``."""
    if "failure" in arm:
        return arm
    bill = arm["bill"]
    wasted = bill["wasted"]
    row = {
        "final_latency_s": final_s,
        "fastest_latency_s": fastest_s,
        "wall_s": round(arm["wall_s"], 1),
        "measured": wasted["of"],
        "screened": arm.get("screened", 0),
        "device_s_measuring": bill["device_s_measuring"],
        "energy_j": bill["energy_j"],
        "gpu_energy_j": bill.get("gpu_energy_j"),
        "energy_method": bill["method"]["cpu"],
        "gpu_energy_method": bill["method"]["gpu"],
        "cpu_s": bill["cpu_s"],
        "wasted_share": round(wasted["measurements"] / wasted["of"], 3) if wasted["of"] else None,
    }
    if "policies" in arm:
        p = arm["policies"]
        row["phases"] = bill["phases"]
        row["drop_rate"] = p["filter"].get("would_be_best_drop_rate")
        row["final_best_drop_rate"] = p["filter"].get("final_best_drop_rate")
        row["filter"] = {k: v for k, v in p["filter"].items() if k != "filter"}
        row["preemption"] = {"rule": p["preemption"].get("rule"), "tasks_stopped": len(p["preemption"]["tasks_stopped"]),
                             "job_stopped": p["preemption"]["job_stopped"]}
        row["model_tau"] = p["latency_model"]["mean_tau_trained"]
        row["search_rounds"] = p.get("search_rounds")  # by kind: a guided round costs ~9x an evolved one on a CPU
        row["curve"] = arm["curve"]
    return row


def _compare(engine: dict[str, Any], trimmer: dict[str, Any],
             interval: tuple[float, float] | None = None) -> dict[str, Any]:
    """A policy arm (the trimmer, or the ablation) against the engine; ``interval``: the latency ratio's 95%
    bootstrap interval from the re-timing turns."""
    if "failure" in engine or "failure" in trimmer:
        return {"note": "an arm failed"}
    saving = lambda k: round(1 - trimmer[k] / engine[k], 3) if engine[k] else None  # noqa: E731
    latency = (trimmer["final_latency_s"] / engine["final_latency_s"]
               if trimmer["final_latency_s"] and engine["final_latency_s"] else None)
    out = {"device_s_saving": saving("device_s_measuring"), "energy_saving": saving("energy_j"),
           "wall_saving": saving("wall_s"), "measured_saving": saving("measured"),
           "latency_ratio": round(latency, 4) if latency else None,
           "latency_ratio_interval": [round(x, 4) for x in interval] if interval else None,
           "latency_ratio_fastest": (round(trimmer["fastest_latency_s"] / engine["fastest_latency_s"], 4)
                                     if trimmer.get("fastest_latency_s") and engine.get("fastest_latency_s") else None),
           "drop_rate": trimmer.get("drop_rate"),
           "final_best_drop_rate": trimmer.get("final_best_drop_rate")}
    # the target is on what a drop can cost: a sampled candidate that ended as its task's fastest (runs before
    # that rate was recorded are held to the stricter "beat the best at the time")
    target_rate = out["drop_rate"] if out["final_best_drop_rate"] is None else out["final_best_drop_rate"]
    out["targets_met"] = {
        "device_s_saving": (out["device_s_saving"] or 0) >= TARGETS["device_s_saving"],
        "energy_saving": (out["energy_saving"] or 0) >= TARGETS["energy_saving"],
        "latency_ratio": latency is not None and latency <= TARGETS["latency_ratio"],
        "drop_rate": target_rate is None or target_rate < TARGETS["drop_rate"],
    }
    return out


WARM_MARGINS = (0.10, 0.05, 0.02, 0.0)  # how close to the first run's final estimate a milestone is


def _warm(first: dict[str, Any], warm: dict[str, Any]) -> dict[str, Any]:
    """When each run first came within each of ``WARM_MARGINS`` of the first run's final estimated model
    latency (sum of weight x task best): a warm start that is ahead early but stops a little short shows
    both."""
    if "failure" in first or "failure" in warm or not first.get("curve"):
        return {"note": "a run failed"}
    goal = first["curve"][-1][1]
    reach = lambda curve, m: next((t for t, v in curve if v <= goal * (1 + m)), None)  # noqa: E731
    milestones = [{"within": m, "first_run_s": reach(first["curve"], m), "warm_run_s": reach(warm.get("curve", []), m)}
                  for m in WARM_MARGINS]
    t_first, t_warm = milestones[-1]["first_run_s"], milestones[-1]["warm_run_s"]
    return {"goal_model_latency_s": goal, "first_run_reached_s": t_first, "warm_run_reached_s": t_warm,
            "sooner_ratio": round(t_first / t_warm, 2) if t_first and t_warm else None,
            "warm_final_model_latency_s": warm["curve"][-1][1] if warm.get("curve") else None,
            "milestones": milestones}


ROUNDS_RULE = "patience counted in rounds"  # runs before the rule was recorded: Trimmer's flat-batch count, in rounds


def _counted_in(rule: str) -> str:
    """What a preemption rule's patience counts: the unit after "task patience N" (see ``PlateauPreemption.rule_for``)."""
    unit = re.match(r"task patience \d+ (\w+)", rule)
    return unit.group(1) if unit else "rounds"


def _setup(result: dict[str, Any]) -> tuple[int, str]:
    """What a run's figures depend on besides the search's luck: its budget and the trimmer arm's rule (its
    preemption's, and its filter's guided rounds where they are not the default)."""
    trimmer = result["arms"]["trimmer"]
    rule = trimmer.get("preemption", {}).get("rule") or ROUNDS_RULE
    return result["trials"], rule + GuidedRounds.of(trimmer.get("filter", {})).clauses()


def _unlike_main(report: dict[str, Any], name: str, setup: tuple[int, str], tag: str) -> str:
    """A label's parenthesis: ``tag``, then the budget and the rule's clauses where they are not the main run's."""
    trials, rule = _setup(report["workloads"][name])
    parts = [tag] if tag else []
    if setup[0] != trials:
        parts.append(f"{setup[0]} trials")
    main_clauses = set(rule.split(", "))
    parts += [clause for clause in setup[1].split(", ") if clause not in main_clauses]
    return f" ({', '.join(parts)})" if parts else ""


def _arm_runs(result: dict[str, Any]) -> dict[str, tuple[Any, ...]]:
    """What tells a result's arm runs apart: ``--resume`` keeps an arm and re-times it, which changes its
    latency, not what the run itself spent and measured."""
    return {arm: (r.get("wall_s"), r.get("cpu_s"), r.get("measured")) for arm, r in result["arms"].items()}


def pooled_runs(report: dict[str, Any]) -> dict[tuple[str, tuple[int, str]], list[dict[str, Any]]]:
    """Each workload's compared run and reruns, by (workload, (budget, rule)), in the order they ran."""
    groups: dict[tuple[str, tuple[int, str]], list[dict[str, Any]]] = {}
    for name, first in report["workloads"].items():
        for w in (first, *report.get("reruns", {}).get(name, [])):
            if "targets_met" in w["trimmer_vs_engine"] and w["trimmer_vs_engine"]["latency_ratio"] is not None:
                groups.setdefault((name, _setup(w)), []).append(w)
    return groups


def _spread_table(report: dict[str, Any]) -> list[str]:
    """Each workload's run and reruns pooled by budget and rule: one run cannot resolve 2% on a kernel."""
    groups = pooled_runs(report)
    lines = ["", "Run and reruns pooled by workload, budget and rule (paired runs on other seeds among them): the "
             "spread of the latency ratio is the spread between searches.", "",
             "| workload | runs (seeds) | latency ratio: median (min-max) | device-s saved: median | "
             "energy saved: median | runs meeting all four |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for (name, setup), runs in groups.items():
        label = name + _unlike_main(report, name, setup, "")
        median = lambda key: statistics.median(w["trimmer_vs_engine"][key] for w in runs)  # noqa: E731
        ratios = sorted(w["trimmer_vs_engine"]["latency_ratio"] for w in runs)
        seeds = sorted({w.get("seed", 0) for w in runs})
        met = sum(all(w["trimmer_vs_engine"]["targets_met"].values()) for w in runs)
        lines.append(f"| {label} | {len(runs)} ({', '.join(map(str, seeds))}) | {median('latency_ratio'):.3f} "
                     f"({ratios[0]:.3f}-{ratios[-1]:.3f}) | {median('device_s_saving'):.0%} | "
                     f"{median('energy_saving'):.0%} | {met} of {len(runs)} |")
    return lines if groups else []


def _ratio_cell(c: dict[str, Any], turns: int | None = None) -> str:
    """A comparison's latency ratio with its re-timing interval (and the turns it rests on, where named)."""
    if c["latency_ratio"] is None:
        return "-"
    if not c.get("latency_ratio_interval"):
        return f"{c['latency_ratio']:.3f}"
    low, high = c["latency_ratio_interval"]
    return f"{c['latency_ratio']:.3f} ({low:.3f}-{high:.3f}{f', {turns} turns' if turns else ''})"


def _ablation_table(runs: Sequence[tuple[str, dict[str, Any]]]) -> list[str]:
    """Preemption alone beside filter and preemption, each against the engine arm of the same run."""
    paired = [(name, w) for name, w in runs if "targets_met" in w.get("preemption_vs_engine", {})]
    if not paired:
        return []

    def cells(c: dict[str, Any]) -> str:
        met = "all four" if all(c["targets_met"].values()) else "missed " + ", ".join(
            k for k, v in c["targets_met"].items() if not v)
        return f"{c['device_s_saving']:.0%} | {c['energy_saving']:.0%} | {_ratio_cell(c)} | {met}"

    lines = ["", "Ablation: the engine with preemption alone (no filter) in the same runs, each policy against the "
             "engine arm, re-timed side by side with it.", "",
             "| workload | preemption alone: device-s saved | energy saved | latency / engine | targets | "
             "filter + preemption: device-s saved | energy saved | latency / engine | targets |",
             "| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | --- |"]
    lines += [f"| {name} | {cells(w['preemption_vs_engine'])} | {cells(w['trimmer_vs_engine'])} |"
              for name, w in paired]
    return lines


def _us(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e6:.1f}"


def _warm_table(result: dict[str, Any]) -> list[str]:
    """Seconds until each warm run came within each margin of the first trimmer run's final estimate."""
    warm = {arm: result[key] for arm, (key, _) in WARM_ARMS.items()
            if "goal_model_latency_s" in result.get(key, {})}
    if not warm:
        return []
    secs = lambda v: "never" if v is None else f"{v:.0f}"  # noqa: E731
    sooner = lambda first, run: f"{first / run:.2f}x" if first and run else "-"  # noqa: E731
    first = next(iter(warm.values()))
    lines = ["", f"Warm start ({WARM_WORKLOAD}): seconds until each run's estimated model latency first came within a "
             f"margin of the first trimmer run's final ({_us(first['goal_model_latency_s'])} us), and how much sooner than the first run. "
             + " ".join(f"{arm} started from {WARM_ARMS[arm][1]}; its own final estimate "
                        f"{_us(w['warm_final_model_latency_s'])} us." for arm, w in warm.items()), "",
             "| within | first run (s) | " + " | ".join(f"{arm} (s) | sooner" for arm in warm) + " |",
             "| ---: | ---: | " + " | ".join("---: | ---:" for _ in warm) + " |"]
    for i, m in enumerate(first.get("milestones", [{"within": 0.0, "first_run_s": first["first_run_reached_s"]}])):
        cells = []
        for w in warm.values():
            run_s = w["milestones"][i]["warm_run_s"] if "milestones" in w else w["warm_run_reached_s"]
            cells.append(f"{secs(run_s)} | {sooner(m['first_run_s'], run_s)}")
        lines.append(f"| {m['within']:.0%} | {secs(m['first_run_s'])} | " + " | ".join(cells) + " |")
    return lines


def write_tables(report: dict[str, Any], stem: str = "trimmer") -> None:
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    write_atomically(OUT_DIR / f"{stem}.json", json.dumps(report, indent=2))
    pct = lambda v: "-" if v is None else f"{v:.0%}"  # noqa: E731
    kj = lambda v: "-" if v is None else f"{v / 1000:.2f}"  # noqa: E731
    gpu = report.get("target", "cpu") == "cuda"
    lines = [f"# Trimmer benchmark ({report['machine']})", "",
             "| workload | arm | final latency (us) | wall (s) | measured | screened | device-s measuring "
             + ("| energy (kJ, GPU measured + CPU est.) | of it GPU (kJ, NVML) |" if gpu else "| energy (kJ, est.) |")
             + " never improved a best | drop rate: beat the best then / ended the best |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |" + (" ---: |" if gpu else "") + " ---: | ---: |"]
    runs = [(name, w) for name, w in report["workloads"].items()]
    runs += [(name + _unlike_main(report, name, _setup(w), "rerun" + (f", seed {w['seed']}" if w.get("seed") else "")),
              w) for name, reruns in report.get("reruns", {}).items() for w in reruns]
    runs += [(f"{name} (earlier: {w['trials']} trials, {_setup(w)[1]})", w)
             for name, old in report.get("superseded", {}).items() for w in old]
    for name, w in runs:
        for arm, r in w["arms"].items():
            if "failure" in r:
                lines.append(f"| {name} | {arm} | failed: {r['failure']} |||||||| ")
                continue
            lines.append(f"| {name} | {arm} | {_us(r['final_latency_s'])} | {r['wall_s']:.0f} | {r['measured']} | "
                         f"{r['screened']} | {r['device_s_measuring']:.1f} | {kj(r['energy_j'])} | "
                         + (f"{kj(r.get('gpu_energy_j'))} | " if gpu else "")
                         + f"{pct(r['wasted_share'])} | {pct(r.get('drop_rate'))} / {pct(r.get('final_best_drop_rate'))} |")
    lines += ["", "| workload | trials (round) | device-s saved | energy saved | wall saved | latency trimmer / engine "
              "(95% re-timing interval) | by the fastest re-timing | preemption counted in | targets met |",
              "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- | --- |"]
    for name, w in runs:
        c = w["trimmer_vs_engine"]
        if "targets_met" not in c:
            continue
        met = ", ".join(k for k, v in c["targets_met"].items() if v) or "none"
        lines.append(f"| {name} | {w['trials']} ({w['round_size']}) | {pct(c['device_s_saving'])} | "
                     f"{pct(c['energy_saving'])} | {pct(c['wall_saving'])} | "
                     f"{_ratio_cell(c, w.get('retiming_turns'))} | "
                     f"{'-' if c.get('latency_ratio_fastest') is None else format(c['latency_ratio_fastest'], '.3f')} | "
                     f"{_counted_in(_setup(w)[1])} | {met} |")
    lines += _spread_table(report)
    lines += _ablation_table(runs)
    lines += _warm_table(report["workloads"].get(WARM_WORKLOAD, {}))
    energy = ("Energy: the GPU's own counter (NVML total energy, measured) plus the CPUs' share, estimated "
              "(no RAPL counter readable) as CPU-seconds of every process of the arm x 7.5 W per busy core. "
              if gpu else "Energy is estimated (this VM exposes no RAPL counter): CPU-seconds of every process of "
              "the arm x 7.5 W per busy core. ")
    lines += ["", energy + "Device-seconds: time the measuring device was busy timing candidates (for "
              "stock, its runner's wall time). Drop rate: of the candidates the filter dropped or would have dropped "
              "and measured all the same (its random exploration sample; every proposal of the rounds it did not "
              "filter), the share that beat their task's best at the time, and the share that ended as their "
              "task's fastest of the job (what a drop can cost; the target's rate, '-' in runs before it was "
              "recorded, which are held to the first). Re-timing interval: the latency ratio's 95% bootstrap "
              "interval over the re-timing turns, resampled in pairs (the timing noise in one run's ratio; runs "
              "before it was recorded show none; the search's luck shows only across runs). Runs that name their "
              f"turns were re-timed over that many, resampled in blocks of {BLOCK} consecutive turns (the host's "
              "states last that long: see bench/remeasure.py); the others over 10 turns, resampled one by one. "
              "The latency ratio is of the arms' median re-timings (what a deployment sees); 'by the fastest "
              "re-timing' is of their quietest turns, the statistic tuning ranks candidates by ('-' in runs before it was recorded). "
              f"Targets (trimmer vs engine): device-s and energy saved >= {TARGETS['device_s_saving']:.0%}, "
              f"latency ratio <= {TARGETS['latency_ratio']}, drop rate < {TARGETS['drop_rate']:.0%}."]
    if report.get("notes"):
        lines += ["", *(f"- {note}" for note in report["notes"])]
    write_atomically(OUT_DIR / f"{stem}.md", "\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", default=",".join(BUDGETS))
    parser.add_argument("--work-root", type=Path, default=Path("results/bench/work/trimmer"))
    parser.add_argument("--target", default="cpu", help="cpu, or cuda on a machine with an NVIDIA GPU")
    parser.add_argument("--arms", default=",".join(a for a in ARMS if a != ABLATION),
                        help="which arms to run; the comparison needs engine and trimmer (others are only saved)")
    parser.add_argument("--rerun", action="store_true",
                        help="keep the recorded results and add these runs as reruns, compared side by side")
    parser.add_argument("--trials", type=int, help="override each workload's trial budget (its round size kept)")
    parser.add_argument("--seed", type=int, default=0,
                        help="our arms' search seed (with --rerun: a paired run on another seed)")
    parser.add_argument("--patience-counts", choices=COUNTS, default=COUNTS[0],
                        help="what the trimmer arms' preemption patience counts: proposals, or measurements only")
    parser.add_argument("--guided-pool", type=float, default=GuidedRounds.pool,
                        help="the trimmer arms' --filter-guided-pool: a guided round proposes this many rounds")
    parser.add_argument("--guided-generations", type=int, default=GuidedRounds.generations,
                        help="the trimmer arms' --filter-guided-generations: a guided round evolves this many")
    parser.add_argument("--guided-population", type=int, default=GuidedRounds.population,
                        help="the trimmer arms' --filter-guided-population: schedules a guided round evolves per "
                             "candidate it brings")
    parser.add_argument("--resume", action="store_true",
                        help="keep each arm that an earlier run of the same command finished (its work folder's "
                             f"{ARM_RESULT}): a killed benchmark goes on from the arm it was in, and one arm can "
                             "be run alone (--arms engine) and compared later; the code must not have changed since")
    args = parser.parse_args()
    names, chosen = args.workloads.split(","), args.arms.split(",")
    for what, given, known in (("workload", names, BUDGETS), ("arm", chosen, ARMS)):
        unknown = [g for g in given if g not in known]
        if unknown:
            raise SystemExit(f"unknown {what} {unknown[0]!r}; expected one of {', '.join(known)}")
    from autotune.target import host_cores, resolve_target

    stem = "trimmer" if args.target == "cpu" else f"trimmer_{args.target}"
    path = OUT_DIR / f"{stem}.json"
    report = json.loads(path.read_text()) if path.exists() else {"workloads": {}}
    device = resolve_target(args.target).device_name if args.target != "cpu" else None
    report.update({"machine": f"{platform.processor() or platform.machine()}, {host_cores()} cores"
                   + (f", {device}" if device else ""), "target": args.target,
                   "date": time.strftime("%Y-%m-%d"), "targets": TARGETS})
    guided = GuidedRounds(args.guided_pool, args.guided_generations, args.guided_population)
    for name in names:
        result = bench_workload(name, args.work_root / args.target, args.target, chosen, args.trials, args.resume,
                                args.seed, args.patience_counts, guided)
        if not result:
            print(f"[{name}] arms {', '.join(chosen)} saved; the comparison needs engine and trimmer (--resume)",
                  file=sys.stderr)
            continue
        recorded = report["workloads"].get(name)
        if args.rerun:
            reruns = report.setdefault("reruns", {}).setdefault(name, [])
            reruns[:] = [w for w in reruns if _arm_runs(w) != _arm_runs(result)]  # a resumed run counts once
            reruns.append(result)
        else:
            if recorded and _setup(recorded) != _setup(result):  # another budget or rule: keep the old runs, marked
                report.setdefault("superseded", {}).setdefault(name, []).extend(
                    [recorded, *report.get("reruns", {}).pop(name, [])])
            report["workloads"][name] = result
        write_tables(report, stem)
    print((OUT_DIR / f"{stem}.md").read_text())


if __name__ == "__main__":
    main()
