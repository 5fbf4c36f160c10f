"""The exactly-once protocol of one delivery: authenticate, identify, claim, run, finish, answer."""
