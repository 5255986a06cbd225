"""PASSING: shared definitions (wire protocol, packet packing, lane arithmetic, P4Info)."""
