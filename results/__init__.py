"""What a run leaves behind and how it is read: the artifact folder and its manifest (hashes
checked before native code is loaded), the profile format the planner reads, reports, and the
atomic file write and folder swap (``atomic``) that ``autotune``, ``containers`` and the benchmarks record with.

Must not import ``autotune``, ``measure``, ``cost_models`` or ``containers``; they read
artifacts through this package, not the reverse. ``results/bench/`` holds benchmark tables, and
``results/bench/FINDINGS.md`` what each run showed.
"""
