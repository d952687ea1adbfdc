"""The trial budget reaches every task, in proportion to its work, with a warning when thin."""

from __future__ import annotations

import pytest

from autotune.budget import split_budget
from autotune.errors import UsageError
from autotune.tasks import Task


def tasks(*shares: float) -> list[Task]:
    return [Task(f"t{i}", None, 1, s) for i, s in enumerate(shares)]


def test_every_task_gets_its_floor_and_the_rest_follows_work():
    plan = split_budget(tasks(1e9, 1e6, 1e3), total=100, floor=8)
    assert sum(plan.trials.values()) == 100
    assert min(plan.trials.values()) >= 8
    assert plan.trials["t0"] > plan.trials["t1"] >= plan.trials["t2"]
    assert plan.warning is None


def test_thin_budget_warns_but_still_covers_every_task():
    plan = split_budget(tasks(5, 1, 1, 1), total=10, floor=8)
    assert sum(plan.trials.values()) == 10 and min(plan.trials.values()) >= 2
    assert "below 8 per task for 4 tasks" in plan.warning


def test_budget_below_task_count_is_an_error():
    with pytest.raises(UsageError, match="--trials 3 is fewer than the model's 4 tasks"):
        split_budget(tasks(1, 1, 1, 1), total=3, floor=8)


def test_bert_feed_forward_second_task_is_not_starved():
    """The issue's case: 64 trials for BERT's two-task feed-forward block; stock gives all to the first."""
    from autotune.frontend import prepare_for_tuning, to_relax
    from autotune.models.loader import export, load_model
    from autotune.target import resolve_target
    from autotune.tasks import extract_tasks

    model = load_model("zoo:bert_ffn")
    target = resolve_target("cpu").tvm_target()
    found = extract_tasks([prepare_for_tuning(to_relax(export(model), model.spec), target)], target)
    matmuls = [t.name for t in found if "matmul" in t.name]
    assert len(matmuls) == 2
    plan = split_budget(found, total=64, floor=8)
    assert sum(plan.trials.values()) == 64 and min(plan.trials.values()) >= 1
    assert all(plan.trials[name] >= 8 for name in matmuls)


def test_share_out_hands_out_every_trial_by_share():
    from autotune.budget import share_out

    parts = share_out(10, [3.0, 1.0, 1.0])
    assert sum(parts) == 10 and parts[0] >= 5 and min(parts) >= 1


def test_a_task_gets_four_rounds_of_eight_to_thirty_two_candidates():
    from autotune.budget import round_size_for

    assert [round_size_for(b) for b in (1, 32, 64, 100, 128, 1000)] == [8, 8, 16, 25, 32, 32]
