"""The deploy kit: ``tasklease/deploy/deploy.py`` run from a checkout, or ``tasklease deploy`` for a
project of your own; both call :func:`tasklease.deploy.deploy.run`. Standard library only.

``config`` (the TOML model and its checks), ``proxies`` (proxy job targets), ``source`` (what
the buildpack installs, the Procfile), ``gcloud`` (the one adapter to Google Cloud),
``settings`` (queue and job settings, compared with ``==``), ``plan`` (the steps of a deploy
and a teardown), ``firestore`` and ``iam`` (their steps), ``deploy`` (``run`` and the script).
"""
