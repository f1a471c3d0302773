"""What reading the agent's database raises."""


class SourceError(RuntimeError):
    """The database could not be read. The message never holds a password."""


class ConnectionLost(SourceError):
    """The connection to the database was lost or refused: worth retrying."""


# The server's refusals of a login, and what to check for each: 1045 a wrong password, user or
# host, 1698 a user that may not log in with a password, 1044 a database closed to the user.
_ACCESS_DENIED = {
    1045: "the password, and that the user may connect from this host (the host in the message)",
    1698: "how the user authenticates: it may not log in with a password (unix_socket or auth_socket)",
    1044: "the user's grant: it may not use this database",
}


def _mysql_error(error: BaseException) -> tuple[int | None, str]:
    """The server's error number and message, as PyMySQL, mysqlclient and mysql-connector carry them."""
    args: tuple = tuple(getattr(error, "args", ()))
    code = getattr(error, "errno", None)
    if not (isinstance(code, int) and code > 0):
        code = args[0] if args and isinstance(args[0], int) else None
    message = getattr(error, "msg", None) or (args[1] if len(args) > 1 else str(error))
    return code, str(message)


def connect_failure(error: BaseException, password_file: str) -> str:
    """Why a first connection failed, in words that point at the fix: a refused login is not an
    unreachable server, and an unreadable password file is neither."""
    if isinstance(error, SourceError):
        return f"not connected: {error}"
    reason = getattr(error, "orig", None) or error
    code, message = _mysql_error(reason)
    if code not in _ACCESS_DENIED:
        return f"unreachable: {reason}"
    sent = f"source.password_file ({password_file})" if password_file else "the password in source.url"
    if "using password: NO" in message:
        sent = "no password was sent: set source.password_file"
    return f"reached, but the server denied access (MySQL error {code}: {message}); check {_ACCESS_DENIED[code]}; {sent}"
