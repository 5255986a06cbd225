"""Per-server agent: in-host pre-aggregation and streaming to the switch."""

# All-reduce strategies passing-agent can run (host_agent/strategies.py); here so that the
# command line knows them without importing torch.
STRATEGIES = ("passing", "ina", "ring", "hier-ring", "ps")
