"""The build side: a manifest in, kernels compiled or fetched into the store, a lock file out.

``manifest`` (its fields checked by ``manifest_check``) -> ``workload`` -> ``plan`` -> ``shard``
-> ``pipeline`` (``run_build``: the build itself) -> the lock; beside it ``remote_session``
(the build's remote cache policy), ``closure`` (a manifest's closure in the remote cache),
``audit`` (recompile and compare), ``explain``, ``profile_move`` and ``suggest`` (miss reports
-> manifest lines).

This package re-exports nothing, not even ``run_build``: importing it would then import the
pipeline and what it needs (the store, the derive code, the keys: dozens more modules)
for every light user of ``manifest`` or ``plan`` (``gemmar-aot plan``, ``suggest``).
Import each name from its own module.
"""
