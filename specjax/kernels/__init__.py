"""Hand-written kernels for what XLA does poorly on the machine at hand (see cpu.py)."""
