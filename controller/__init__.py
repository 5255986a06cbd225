"""P4Runtime control plane (see issue: controller)."""
