"""PASSING: shared definitions (wire protocol, packet packing, scapy layer)."""
