"""Tests of the producer."""
