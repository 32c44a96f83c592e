"""The jax_mok benchmark harness (../shared/BENCHMARKS.md): ``python -m benchmarks.run``.

Modules: ``problems`` (inputs, routing skew, the reference check), ``timing``, ``peers_jax``
(jax_mok, B1, B2), ``peers_torch`` (B3), ``ceilings`` (matmul and HBM ceilings), ``worker`` (one
shape in one process), ``report`` (JSON, markdown, PNG), ``run`` (the command line) and
``cpu_ratio`` (the CPU speed-up check of issue 2).
"""
