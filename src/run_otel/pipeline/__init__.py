"""What drives the data path: the poller, its checkpoint, backfill, read-ahead and late feedback."""
