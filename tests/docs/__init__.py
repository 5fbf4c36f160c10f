"""Tests of the docs, the README and the examples."""
