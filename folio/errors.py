"""Typed errors the SDK raises, each with a message a user can act on."""


class FolioError(Exception):
    """Base class of every Folio client error."""


class ServerUnreachable(FolioError):
    """No Folio frontend answered at the address, or the connection was lost."""


class RequestRejected(FolioError):
    """The server refused the request (invalid parameters, prompt too long, ...)."""


class QueueFull(RequestRejected):
    """The server's waiting queue is full; retry later."""


class ShuttingDown(ServerUnreachable):
    """The server is draining before it stops: it refused a new request, or aborted one
    that did not finish within its shutdown timeout. Retry on another server or later."""


class EngineDead(FolioError):
    """The scheduler or executor behind the frontend is gone; the request failed."""


class RequestTimeout(FolioError):
    """No answer within the request's timeout; the request was aborted."""


_BY_CODE = {"invalid": RequestRejected, "rejected": RequestRejected, "queue_full": QueueFull,
            "engine_dead": EngineDead, "timeout": RequestTimeout, "shutting_down": ShuttingDown}


def error_from_code(code: str, message: str) -> FolioError:
    return _BY_CODE.get(code, FolioError)(message)
