"""The apps bench.cold_start spawns, one module each: neither pays for the other's imports."""
