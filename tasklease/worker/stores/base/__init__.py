"""What every store shares: the store protocols, the codec, handler transactions, the tally."""
