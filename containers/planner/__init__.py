"""The placement planner, after InferLine (SoCC 2020): provision an inference pipeline to a tail-latency SLO at least cost.

One module per concept: ``pipeline`` (the stages, from a TOML file), ``profiles`` (service
times per hardware and batch), ``hardware`` (keys and prices), ``trace`` (arrivals and their
traffic envelope), ``config`` (a configuration and its cost), ``batchqueue`` (one stage as a
batched k-server queue) and ``estimator`` (the whole pipeline simulated over a trace),
``planner`` (Algorithms 1 and 2) and ``baselines`` (coarse-grained CG-Mean, CG-Peak), ``plan``
(the versioned result), ``tuner`` (Algorithms 3 and 4), ``simulate`` (replaying a plan) and
``deploy_plan`` (a plan as container specs, pinned to cores). Pure Python and numpy: nothing here imports
TVM, torch or the tuning packages.
"""
