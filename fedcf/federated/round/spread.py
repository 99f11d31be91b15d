"""The client halves of a secure round spread over parts that each hold some of the clients
(worker processes of a simulation, an executor's shards), as the server half talks to them."""

from __future__ import annotations


class SpreadHalves:
    """Each protocol step goes to every part and the parts' messages come back, in part order.
    A subclass answers ``_ask(step, args_of)`` (``args_of(part)``: that part's arguments; the
    parts' messages as one list) and ``_parts_of(clients)`` (the part holding each client)."""

    def _ask(self, step: str, args_of) -> list:
        raise NotImplementedError

    def _parts_of(self, clients: list) -> list:
        raise NotImplementedError

    def advertise(self, registry) -> list:
        return self._ask("advertise", lambda part: (registry,))

    def share(self, adverts) -> list:
        return self._ask("share", lambda part: (adverts,))

    def mask(self, inboxes: dict, dropped) -> list:
        """Each part gets only the inboxes of its own clients."""
        where = dict(zip(inboxes, self._parts_of(list(inboxes))))
        return self._ask("mask", lambda part: (
            {c: box for c, box in inboxes.items() if where[c] == part}, dropped))

    def consistency(self, u3) -> list:
        return self._ask("consistency", lambda part: (u3,))

    def unmask(self, u3, sigs) -> list:
        return self._ask("unmask", lambda part: (u3, sigs))
