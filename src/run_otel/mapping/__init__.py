"""Rows to spans: a pure function of a run, its tool rows and the config, with its caps and redaction."""
