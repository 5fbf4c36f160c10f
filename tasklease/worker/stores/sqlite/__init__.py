"""The SQLite store, the embedded default: one file shared by a machine's processes."""
