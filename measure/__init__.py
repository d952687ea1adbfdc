"""The measurement engine: builds candidates and times them on device slots.

Owns the engine interface (``engine``) and the engines: ``parallel`` (warm build
workers in ``workers``/``build``, device slots in ``slots``, on-device adaptive timing
in ``timing``, the degree-of-parallelism controller and verification in ``dop``,
calibration in ``calibration``) and ``stock`` (MetaSchedule's own builder and runner);
``factory`` makes one from command-line words. Must not import ``autotune``,
``cost_models``, ``containers`` or ``results``.
"""
