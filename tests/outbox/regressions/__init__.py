"""Regressions of tests/outbox: one file per bug, named as the sentence that must hold."""
