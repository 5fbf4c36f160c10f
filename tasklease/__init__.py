"""The ``tasklease`` command: the demo, the local emulator, the dev stack."""

__all__: list[str] = []
