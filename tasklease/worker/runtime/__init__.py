"""Where handler code runs: delivery threads, the event loop for async handlers."""
