"""`passing-agent`: what each host of a Mininet fabric (or a testbed) runs for timed
all-reduces and the training workload: PASSING or a baseline it offers (switch-only `ina`,
`ring`, `hier-ring`, `ps`), the start line that every rank's timers share, and the check of
every result against the exact sum. The library it drives is host_agent/; bench/ drives it."""

# Here so that command lines know the strategies without importing torch.
STRATEGIES = ("passing", "ina", "ring", "hier-ring", "ps")
