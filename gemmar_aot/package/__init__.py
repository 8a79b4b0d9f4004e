"""Artifact wheels: one manifest's kernels as a pip-installable, reproducible wheel.

- ``layout``: what a wheel holds and what it is called (the layout, names, versions, the
  package's file names, the lock's blob sizes and coverage), and ``WheelError``.
- ``archive``: the zip and its RECORD, the same bytes for the same files.
- ``wheel``: writing one (``gemmar-aot wheel``): ``wheel_from_lock``, ``build_wheel``.
- ``inspect``: reading one back and checking every byte of it (``gemmar-aot inspect``).
"""
