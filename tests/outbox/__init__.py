"""Tests of the transactional outbox and its relay."""
