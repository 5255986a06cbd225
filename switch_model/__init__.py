"""Software model of the PASSING switch: the P4 pipeline in Python on raw-socket ports,
with a P4Runtime server."""
