"""Running and steering a deployment: the daemon, HA lease, check, status/rewind/export, the demo."""
