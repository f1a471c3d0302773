"""The bridge's own signals: the metric catalogue, /metrics and the probes, exemplars, logs."""
