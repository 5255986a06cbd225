"""`passing-agent`: the harness that runs timed all-reduces (PASSING or a baseline) or the
training workload on one host and checks every result. Not part of the host agent users
install on their servers (host_agent/): it brings the baselines and the random-tensor checker."""

# Here so that command lines know the strategies without importing torch.
STRATEGIES = ("passing", "ina", "ring", "hier-ring", "ps")
