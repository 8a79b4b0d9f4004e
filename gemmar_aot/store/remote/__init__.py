"""The shared remote cache: a store backend over Bazel's HTTP remote-cache protocol.

- ``backend``: :class:`~gemmar_aot.store.remote.remote_backend.HttpBackend`, the remote cache as a
  :class:`~gemmar_aot.store.backend.CacheBackend` (``/ac/<key>`` and ``/cas/<sha256>``, what
  each holds, and the checks every read makes), and ``remote_url`` (``--remote`` or
  ``$GEMMAR_AOT_REMOTE``).
- ``http``: the HTTP client (``GET/PUT/HEAD``, timeouts, retries, credentials); it moves bytes
  and nothing else.
- ``reapi``: the REAPI ``ActionResult`` protobuf an ``/ac/`` entry is, written and read by hand.

The build's use of it (one session a build, a manifest's closure) is the build side's.
Runtime-safe: standard library + ``zstandard``.
"""
