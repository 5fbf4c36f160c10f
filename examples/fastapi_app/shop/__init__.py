"""A shop's FastAPI app: its API, and tasklease's worker mounted at ``/worker``."""
