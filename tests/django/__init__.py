"""Tests of the Django Tasks backend."""
