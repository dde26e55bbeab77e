"""The sandbox: where a generated solution runs, and the one channel to it.

Trusted side: ``processes`` (spawn, watch, pause and kill children; a pool of warm ones; each
child's cgroup from ``cgroups``) and ``session`` (the one place that speaks the job protocol). Child side: ``child`` (the entry point,
``python -m kernelrl.env.sandbox.child``), ``isolation`` (with ``isolation_mounts``,
``isolation_user``, ``linux``), ``job`` (serving one job), ``failures``, ``compile_only`` and
``guard``. Both sides: ``protocol`` (the messages) and ``harness`` (modules, models and inputs
built identically on both sides).

Nothing is imported here: the child isolates itself before torch starts its threads.
"""
