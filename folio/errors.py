"""Typed errors the SDK raises, each with a message a user can act on."""

from folio.shared.protocol.codes import RefusalCode


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


class RequestFailed(FolioError):
    """This request alone failed in the engine (e.g. its adapter's output was NaN); the
    message says why. The server goes on serving; retrying the same request fails again."""


class RequestTimeout(FolioError):
    """No answer within the request's timeout; the request was aborted."""


class SlowReader(FolioError):
    """This client fell so far behind reading its replies that its queue on the server filled
    up: the server aborted its requests (or dropped ones sent meanwhile). Read replies as they
    come, or run fewer requests at once."""


_BY_CODE = {RefusalCode.INVALID: RequestRejected, RefusalCode.REJECTED: RequestRejected,
            RefusalCode.QUEUE_FULL: QueueFull, RefusalCode.ENGINE_DEAD: EngineDead,
            RefusalCode.TIMEOUT: RequestTimeout, RefusalCode.SHUTTING_DOWN: ShuttingDown,
            RefusalCode.SLOW_READER: SlowReader, RefusalCode.REQUEST_FAILED: RequestFailed}


def error_from_code(code: RefusalCode | str, message: str) -> FolioError:
    """The error class for a frontend's `error` code; FolioError for an unknown one."""
    return _BY_CODE.get(code, FolioError)(message)
