"""The Spanner store: Google's client library."""
