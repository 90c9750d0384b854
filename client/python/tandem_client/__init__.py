"""tandem_client: the Python client of the tandem inference service.

    from tandem_client import Client
    with Client("ipc:///run/tandem/client.sock") as c:
        for event in c.generate("Hello", max_tokens=16):
            print(event)                      # TokenEvent ..., then one FinalEvent
        print(c.status()["running"], c.metrics_text())

The semantics are the C++ library's (client/include/tandem/client.h): every request ends with
exactly one final event; calls that fail raise TandemError with the library's code names.
"""
from .client import Client, Event, FinalEvent, Stream, TandemError, TokenEvent

__all__ = ["Client", "Event", "FinalEvent", "Stream", "TandemError", "TokenEvent"]
