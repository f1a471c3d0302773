"""The dashboards and alert rules, generated from the metric catalogue."""
