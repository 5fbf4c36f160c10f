"""Regressions of tests/producer: one file per bug, named as the sentence that must hold."""
