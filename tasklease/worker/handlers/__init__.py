"""Handlers as users write them: the router, its handles, schedules in code, the context, steps."""
