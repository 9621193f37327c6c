"""The transerve client SDK; see transerve.client."""

from .client import (APIConnectionError, APIStatusError, APITimeoutError, AsyncClient, AuthenticationError,
                     BadRequestError, Client, InternalServerError, OverloadedError, PayloadTooLargeError,
                     TranserveError)

__all__ = ["Client", "AsyncClient", "TranserveError", "APIConnectionError", "APITimeoutError", "APIStatusError",
           "BadRequestError", "AuthenticationError", "PayloadTooLargeError", "OverloadedError", "InternalServerError"]
