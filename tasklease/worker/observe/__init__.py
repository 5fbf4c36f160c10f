"""What a delivery tells the outside: traces, metrics, structured logs, the delivery tally."""
