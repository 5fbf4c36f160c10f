"""Process and file plumbing that the worker, its stores and the emulator share, owned by none.

``group_commit`` (changes of many threads in one transaction), ``per_process`` (values made
once per process, remade after a fork), ``private_files`` (0600 files that refuse what others
planted), ``writer_lock`` (one SQLite writer across processes), ``otel_setup`` (OpenTelemetry
SDKs from the environment), ``serve`` (a gunicorn worker on 127.0.0.1 for dev and tests),
``loopback`` and ``hosts`` (which names are this machine), ``spanner_calls`` (bounded Spanner
calls, for the Spanner store and outbox), ``rpc_deadlines`` (deadlines for a Google client's
RPCs), ``joined_trace`` (the trace a delivery joined, for
the producer's fan-out), ``keywords`` (unknown keywords refused where ``**options`` are
typed). Nothing here imports ``tasklease.worker``, ``tasklease.producer`` or
``tasklease.emulator``: every side depends on it, never the reverse.
"""

__all__: list[str] = []
