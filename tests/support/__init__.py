"""Shared test helpers: apps, services the fixtures start, fakes."""
