"""Tests of the local Cloud Tasks and Cloud Scheduler emulator."""
