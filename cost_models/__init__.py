"""What is learned or estimated about candidates: the latency model (and, later, the candidate
filter, preemption policy and energy meters).

Must not import ``autotune``, ``containers`` or ``results``: the tuner calls in, never the reverse.
"""
