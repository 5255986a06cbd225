"""Per-server agent: in-host pre-aggregation and streaming to the switch."""
