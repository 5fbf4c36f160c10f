"""Regressions of tests/stores: one file per bug, named as the sentence that must hold."""
