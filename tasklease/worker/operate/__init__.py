"""What an operator does to runs and locks: list, show, release, replay, find stuck schedules."""
