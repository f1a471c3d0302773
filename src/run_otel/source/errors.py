"""What reading the agent's database raises."""


class SourceError(RuntimeError):
    """The database could not be read. The message never holds a password."""


class ConnectionLost(SourceError):
    """The connection to the database was lost or refused: worth retrying."""
