"""Regressions of tests/django: one file per bug, named as the sentence that must hold."""
