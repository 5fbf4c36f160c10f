"""Tests of the operators' dashboard."""
