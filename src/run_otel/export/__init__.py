"""Spans out over OTLP: the encoder, the sinks, requests under the receiver's limit, log records, Phoenix."""
