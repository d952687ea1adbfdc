"""The measurement engine: builds candidates and times them on device slots.

Owns the engine interface (``engine``), the engines themselves, and the fast TVM
import used by build workers. Must not import ``autotune``, ``cost_models``,
``containers`` or ``results``.
"""
