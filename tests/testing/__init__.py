"""Tests of the pytest plugin users' tests use."""
