"""Regressions of tests/worker: one file per bug, named as the sentence that must hold."""
