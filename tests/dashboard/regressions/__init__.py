"""Regressions of tests/dashboard: one file per bug, named as the sentence that must hold."""
