"""The in-memory store: one process, for tests and the local demo."""
