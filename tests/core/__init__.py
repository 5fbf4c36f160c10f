"""Tests of the pure decision logic."""
