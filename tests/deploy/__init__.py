"""Tests of the deploy kit."""
