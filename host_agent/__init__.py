"""Per-server agent: in-host pre-aggregation and streaming to the switch.

Importing the package registers the `passing` torch.distributed backend (host_agent.backend), for
processes where torch's start-up autoloading (host_agent.autoload) is turned off.
"""

from host_agent.autoload import register

register()
