"""The agent's database: the two tables, their rows read by meaning, the source's clock and its guards."""
