"""Regressions of tests/deploy: one file per bug, named as the sentence that must hold."""
