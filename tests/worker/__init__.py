"""Tests of the worker: handlers, delivery, serving, observing, operating."""
