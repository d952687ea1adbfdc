"""The latency model that ranks candidates for the evolutionary search and for the candidate filter.

MetaSchedule's XGBoost model on its per-store features (164 per buffer store),
trained online on normalised throughput: a prediction of 1.0 means "as fast as the
best measured so far for this kernel", above 1.0 "faster". One model is shared by all
tasks of a session, so what it learns on one kernel helps the next.

A model is saved with what it was trained on, in a format that loads without pickle
(the stock ``XGBModel.save`` writes a pickled NumPy object array, which would run
code from whoever wrote the file). A saved model, or an earlier tuning database,
starts the next job warm, so its first rounds are not random guesses; what it learned
before does not slow how soon it learns the job's own measurements (``PacedXGBModel``).
"""

from __future__ import annotations

import functools
import json
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

FEATURE_LENGTH = 164  # PerStoreFeature's length per buffer store in TVM 0.27
FORMAT = "autotune-latency-model/1"
META, BOOSTER, DATA = "meta.json", "booster.json", "data.npz"


class CostModelRefused(Exception):
    """A saved model or database that cannot start this job's model; the message says why."""


FEATURES_KEPT = 8192  # schedules whose features are remembered (a few KB each: tens of MB at most)
SCORING_SAMPLES = 32  # proposals are scored once the model has learned from this many measurements
WARMUP_SAMPLES = 32  # and MetaSchedule's search gets its predictions from then on (its default waits for 100)


def create_latency_model(num_cores: int, seed: int = 0, warmup_samples: int = WARMUP_SAMPLES) -> Any:
    """A fresh XGBoost latency model using ``num_cores`` threads for training.

    Until it holds ``warmup_samples`` measurements it returns random scores to MetaSchedule's
    search; the session only hands a round to that search once the model ranks fresh candidates
    well (``autotune.search``), since a guided round featurises its whole population.
    """
    from tvm.s_tir.meta_schedule.cost_model.xgb_model import XGBConfig

    return _paced_model_class()(
        extractor=remembered_features(),
        adaptive_training=True,
        num_tuning_cores=num_cores,
        num_warmup_samples=warmup_samples,
        config=XGBConfig(seed=seed),
    )


@functools.cache
def _paced_model_class() -> type:
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.cost_model import XGBModel

    @derived_object
    class PacedXGBModel(XGBModel._cls):
        """MetaSchedule's XGBoost model, its training paced by this session's measurements.

        MetaSchedule retrains once its data has grown by a fifth since it last trained. Counted on all
        it holds, a model started warm with 1,000 earlier samples would wait for 200 of this session's
        before it retrained: the session's first rounds of a new kernel would be scored by a model that
        has not seen one measurement of it. So the samples it held before the session
        (``held_before``) are left out of that count: it retrains on the session's first measurements,
        then as often as a fresh model would, each time on everything it holds.
        """

        held_before = 0

        def update(self, context: Any, candidates: list[Any], results: list[Any]) -> None:
            held = self.held_before
            self.data_size -= held
            self.last_train_size = max(self.last_train_size - held, 0)
            try:
                super().update(context, candidates, results)
            finally:
                self.data_size += held
                self.last_train_size += held

    return PacedXGBModel


def _held_before_session(model: Any) -> None:
    """What ``model`` holds now was learned before the session: its training pace counts what comes next."""
    model._inst.held_before = model._inst.data_size


def remembered_features(kept: int = FEATURES_KEPT) -> Any:
    """MetaSchedule's per-store features, computed once per schedule of a job.

    Featurising is a third of the search's CPU on a ResNet-18 convolution, and a third of
    what is asked for was featurised before: MetaSchedule's search featurises its
    whole population each round, its best measured schedules again every time; a round's
    proposals are featurised to score them, and the measured ones again to train on. So the
    features of the last ``kept`` schedules are remembered, by the schedule's structural hash
    (and the target kind, which the features depend on). ``hits`` and ``misses`` count lookups.
    """
    return _remembered_features_class()(kept)


@functools.cache
def _remembered_features_class() -> type:
    import tvm_ffi
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.feature_extractor import PerStoreFeature, PyFeatureExtractor

    @derived_object
    class RememberedFeatures(PyFeatureExtractor):
        def __init__(self, kept: int) -> None:
            self.kept, self.hits, self.misses = kept, 0, 0
            self._inner = PerStoreFeature()
            self._features: OrderedDict[tuple[str, int], Any] = OrderedDict()

        def extract_from(self, context: Any, candidates: list[Any]) -> list[Any]:
            kind = context.target.kind.name if context.target is not None else ""
            keys = [(kind, tvm_ffi.structural_hash(c.sch.mod)) for c in candidates]
            new = {k: c for k, c in zip(keys, candidates) if k not in self._features}
            if new:
                for key, features in zip(new, self._inner.extract_from(context, list(new.values()))):
                    self._features[key] = features
            self.misses += len(new)
            self.hits += len(keys) - len(new)
            for key in keys:
                self._features.move_to_end(key)
            out = [self._features[k] for k in keys]
            while len(self._features) > self.kept:
                self._features.popitem(last=False)
            return out

    return RememberedFeatures


def target_key(target: Any) -> str:
    """What a model's measurements are only valid for: the target kind and its CPU or GPU model."""
    attrs = dict(target.attrs)
    return f"{target.kind.name}:{attrs.get('mcpu') or attrs.get('arch') or 'generic'}"


def for_target(record: Any, target: Any) -> bool:
    """Whether a tuning record was measured on ``target`` (as ``target_key`` tells targets apart)."""
    return record.target is not None and target_key(record.target) == target_key(target)


def is_trained(model: Any) -> bool:
    """Whether ``score`` gives the model's own predictions (the search may still get random ones)."""
    inner = model._inst
    return inner.booster is not None and inner.data_size >= min(SCORING_SAMPLES, inner.num_warmup_samples)


def score(model: Any, context: Any, candidates: Sequence[Any]) -> list[float]:
    """The model's normalised throughput for ``candidates`` (1.0 = the task's best so far).

    Unlike ``model.predict``, which hides a booster trained on fewer than ``num_warmup_samples``
    behind random numbers so that the search stays cheap and unbiased early on, this asks the
    booster as soon as ``is_trained``: scoring one round's proposals costs little. Zeros before.
    """
    inner = model._inst
    if not candidates or not is_trained(model):
        return [0.0] * len(candidates)
    features = [x.numpy().astype("float32") for x in inner.extractor.extract_from(context, candidates)]
    return [float(v) for v in inner._predict(xs=features)]


def features_reused(model: Any) -> dict[str, int] | None:
    """How many schedules the model featurised and how many featurisations it was spared (None: it forgets)."""
    extractor = getattr(model._inst.extractor, "_inst", None)
    return {"computed": extractor.misses, "reused": extractor.hits} if hasattr(extractor, "hits") else None


def samples(model: Any) -> int:
    return int(model._inst.data_size)


def save_latency_model(model: Any, folder: str | Path, target: Any) -> None:
    """Write the model and its training data into ``folder`` (made if missing). A caller replacing a saved
    model writes into a fresh folder and swaps it into place (``results.atomic.staged_folder``)."""
    inner = model._inst
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    groups = list(inner.data.values())
    rows = [f for g in groups for f in g.features]
    np.savez(
        folder / DATA,
        group_hashes=np.array([g.group_hash for g in groups], dtype=str),
        group_sizes=np.array([len(g.costs) for g in groups], dtype=np.int64),
        costs=np.concatenate([np.asarray(g.costs, dtype=np.float32) for g in groups]) if groups else np.zeros(0),
        store_counts=np.array([len(f) for f in rows], dtype=np.int64),
        features=np.concatenate(rows) if rows else np.zeros((0, FEATURE_LENGTH), dtype=np.float32),
    )
    if inner.booster is not None:
        inner.booster.save_model(str(folder / BOOSTER))
    import xgboost

    (folder / META).write_text(json.dumps({
        "format": FORMAT, "target": target_key(target), "feature_length": FEATURE_LENGTH,
        "samples": int(inner.data_size), "groups": len(groups), "xgboost": xgboost.__version__,
    }, indent=2))


def load_latency_model(path: str | Path, target: Any, num_cores: int, seed: int = 0) -> Any:
    """A model restored from ``path``.

    Raises:
        CostModelRefused: the folder is not a saved model, is corrupt, or was saved for another
            target or another feature length.
    """
    path = Path(path)
    try:
        meta = json.loads((path / META).read_text())
    except (OSError, ValueError) as err:
        raise CostModelRefused(f"{path} is not a saved latency model ({META}: {err})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CostModelRefused(f"{path}: format {meta.get('format') if isinstance(meta, dict) else meta!r}; expected {FORMAT}")
    if meta.get("target") != target_key(target):
        raise CostModelRefused(f"{path} was trained for {meta.get('target')}; this job tunes for {target_key(target)}")
    if meta.get("feature_length") != FEATURE_LENGTH:
        raise CostModelRefused(f"{path} has {meta.get('feature_length')} features per store; "
                               f"this TVM extracts {FEATURE_LENGTH}")
    try:
        with np.load(path / DATA, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
        model = create_latency_model(num_cores, seed)
        _restore(model, arrays)
        if (path / BOOSTER).exists():
            import xgboost

            booster = xgboost.Booster()
            booster.load_model(str(path / BOOSTER))
            model._inst.booster = booster
    except (OSError, ValueError, KeyError, IndexError) as err:
        raise CostModelRefused(f"{path} is corrupt ({type(err).__name__}: {err})") from None
    except Exception as err:  # noqa: BLE001  xgboost raises its own XGBoostError for a damaged booster
        raise CostModelRefused(f"{path} is corrupt ({type(err).__name__}: {str(err).splitlines()[0]})") from None
    return model


def training_groups(arrays: dict[str, np.ndarray]) -> list[tuple[str, list[np.ndarray], np.ndarray]]:
    """A saved model's training data (``DATA``'s arrays), per task: (group hash, each candidate's per-store
    features, their costs), in the order the model learned them.

    Raises:
        ValueError: the arrays do not agree with each other.
    """
    features, counts = arrays["features"], arrays["store_counts"]
    if features.ndim != 2 or features.shape[1] != FEATURE_LENGTH or counts.sum() != len(features):
        raise ValueError(f"feature table of shape {features.shape} does not match {int(counts.sum())} stores")
    rows = np.split(features.astype(np.float32), np.cumsum(counts)[:-1]) if len(counts) else []
    costs, sizes = arrays["costs"], arrays["group_sizes"]
    if sizes.sum() != len(rows) or len(costs) != len(rows):
        raise ValueError("group sizes, costs and candidates disagree")
    ends = np.cumsum(sizes)
    return [(str(h), rows[end - size:end], costs[end - size:end])
            for h, size, end in zip(arrays["group_hashes"], sizes.astype(int), ends.astype(int))]


def _restore(model: Any, arrays: dict[str, np.ndarray]) -> None:
    from tvm.s_tir.meta_schedule.cost_model.xgb_model import FeatureGroup

    inner = model._inst
    for group_hash, rows, costs in training_groups(arrays):
        inner.data[group_hash] = FeatureGroup(group_hash, list(rows), costs)
    inner.data_size = inner.last_train_size = sum(len(g.costs) for g in inner.data.values())
    _held_before_session(model)


def open_database(folder: str | Path) -> Any:
    """An earlier job's tuning database, read (and not written: only ``commit_workload`` of a workload it
    has may be asked of it).

    Raises:
        CostModelRefused: the folder holds no tuning database, or it is damaged.
    """
    from tvm.s_tir.meta_schedule.database import JSONDatabase

    folder = Path(folder)
    records_file, workloads_file = folder / "database_tuning_record.json", folder / "database_workload.json"
    if not (records_file.is_file() and workloads_file.is_file()):
        raise CostModelRefused(f"{folder} holds no tuning database (database_tuning_record.json and "
                               "database_workload.json)")
    try:  # the database reads and parses both files here
        return JSONDatabase(path_workload=str(workloads_file), path_tuning_record=str(records_file))
    except Exception as err:  # noqa: BLE001  TVM raises its own errors for a damaged file
        raise CostModelRefused(f"{folder}: tuning database is corrupt ({str(err).splitlines()[0]})") from None


def warm_start_from_databases(model: Any, database_dirs: Sequence[str | Path], target: Any, num_threads: int) -> int:
    """Train ``model`` on the measured records of earlier tuning databases for the same target.

    Returns how many records it learned from.

    Raises:
        CostModelRefused: a folder holds no tuning database, or none of its records is for this target.
    """
    learned = 0
    for folder in database_dirs:
        found = learn_records(model, open_database(folder).get_all_tuning_records(), target, num_threads)
        if not found:
            raise CostModelRefused(f"{folder} has no measured records for {target_key(target)}")
        learned += found
    return learned


def learn_records(model: Any, records: Sequence[Any], target: Any, num_threads: int) -> int:
    """Train ``model`` on those of the tuning ``records`` (of any workloads) measured on ``target``.

    Returns how many it learned from. They count as learned before the session
    (``PacedXGBModel``): the model retrains on the session's first measurements.
    """
    import tvm_ffi
    from tvm.s_tir import Schedule
    from tvm.s_tir.meta_schedule import TuneContext
    from tvm.s_tir.meta_schedule.runner import RunnerResult
    from tvm.s_tir.meta_schedule.search_strategy import MeasureCandidate

    by_workload: dict[int, list[Any]] = {}
    for r in records:
        if r.run_secs and for_target(r, target):
            by_workload.setdefault(tvm_ffi.structural_hash(r.workload.mod), []).append(r)
    learned = 0
    for group in by_workload.values():
        mod = group[0].workload.mod
        ctx = TuneContext(mod=mod, target=target, num_threads=num_threads)
        candidates, results = [], []
        for r in group:
            sch = Schedule(mod)
            r.trace.apply_to_schedule(sch, remove_postproc=False)
            candidates.append(MeasureCandidate(sch, r.args_info))
            results.append(RunnerResult([float(s) for s in r.run_secs], None))
        model.update(ctx, candidates, results)
        learned += len(candidates)
    _held_before_session(model)
    return learned
