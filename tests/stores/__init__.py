"""Tests of the stores and their contract suites."""
