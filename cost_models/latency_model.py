"""The latency model that ranks candidates for the evolutionary search.

MetaSchedule's XGBoost model on its per-store features (164 per buffer store),
trained online on normalised throughput. One model is shared by all tasks of a
session, as in stock MetaSchedule, so what it learns on one kernel helps the next.
"""

from __future__ import annotations

from typing import Any


def create_latency_model(num_cores: int, seed: int = 0) -> Any:
    """A fresh XGBoost latency model using ``num_cores`` threads for training."""
    from tvm.s_tir.meta_schedule.cost_model import XGBModel
    from tvm.s_tir.meta_schedule.feature_extractor import PerStoreFeature

    return XGBModel(
        extractor=PerStoreFeature(),
        adaptive_training=True,
        num_tuning_cores=num_cores,
        config=_xgb_config(seed),
    )


def _xgb_config(seed: int) -> Any:
    from tvm.s_tir.meta_schedule.cost_model.xgb_model import XGBConfig

    return XGBConfig(seed=seed)
