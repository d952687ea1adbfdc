"""autotune: TVM MetaSchedule tuning from a PyTorch model to a verified, profiled artifact.

Owns model loading, task extraction, the tuning session, compilation, verification,
profiling and the ``autotune`` command. Imports ``measure``, ``cost_models`` and
``results``; must not import ``containers``. Importing it loads neither torch nor TVM.
"""

__version__ = "0.1.0"
