"""Who may make the worker run a handler: OIDC tokens of Cloud Tasks, Scheduler and operators."""
