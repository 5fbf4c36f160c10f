"""Regressions of tests/emulator: one file per bug, named as the sentence that must hold."""
