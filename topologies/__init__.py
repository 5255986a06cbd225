"""Mininet topologies described as data files."""
