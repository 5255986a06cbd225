"""The group of a job's hosts' leaders (one process per host, its local rank 0), over which they
sum while the job waits for switch slots (host_agent.host_collective): gloo on the hosts' own
addresses, met through a store they all reach (the session rendezvous's)."""

from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist
from torch.distributed import PrefixStore

from passing.contract import JobParams


def leaders_group(store: dist.Store, params: JobParams, host: str,
                  timeout: timedelta) -> dist.ProcessGroup:
    """This leader's member of the leaders' gloo group of `params`' job: rank = the host's
    index among the job's hosts. Every leader calls it together (it connects to each of
    them); its sockets bind to the host's own address (`host_ip`), the one the job's traffic
    uses, whatever the machine's hostname resolves to."""
    opts = dist.ProcessGroupGloo._Options()
    opts._timeout = timeout
    opts._devices = [dist.ProcessGroupGloo.create_device(hostname=params.host(host).host_ip)]
    return dist.ProcessGroupGloo(PrefixStore(f"passing/leaders/{params.job_id}/", store),
                                 params.host_index(host), len(params.hosts), opts)
