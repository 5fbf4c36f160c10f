"""Regressions of tests/cli: one file per bug, named as the sentence that must hold."""
