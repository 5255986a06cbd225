"""Per-server agent: in-host pre-aggregation and streaming to the switch.

Importing the package registers the `passing` torch.distributed backend (host_agent.backend), for
processes where torch's start-up autoloading (passing/_torch_autoload.py) is turned off.
"""

from passing._torch_autoload import register

register()
