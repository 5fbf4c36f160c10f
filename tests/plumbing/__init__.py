"""Tests of the plumbing both sides share."""
