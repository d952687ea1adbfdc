"""Serving: model servers in containers, the QoE manager, deployment schemes and the planner.

Reads artifacts and profiles through ``results`` only; must not import ``autotune``,
``measure`` or ``cost_models``.
"""
