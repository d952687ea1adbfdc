"""What is learned or estimated about tuning: the latency model and how well it ranks
(``latency_model``, ``quality``), the policies that measure less (``candidate_filter``,
``preemption``) and the bill a tuning job runs up (``energy``).

Policies are objects the tuning session is handed; each works with any measurement
engine. Must not import ``autotune``, ``measure``, ``containers`` or ``results``: the tuner
calls in, never the reverse.
"""
