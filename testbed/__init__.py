"""Veth fabrics of switch processes, job setup and packet crafting, for tests and benchmarks."""
