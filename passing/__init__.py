"""PASSING: shared definitions (wire protocol, packet packing, lane arithmetic, P4Info)."""

# The torch.distributed backend's name. Here, not in host_agent.backend, because torch's
# start-up hook (passing._torch_autoload) must know it without importing the backend, and the
# backend reports it as its name(): both take it from the package they already import.
BACKEND = "passing"
