"""The inter-broker credential: what proves a request comes from a broker of this cluster.

Theory of operation
-------------------
With authentication on, brokers talk to each other on two channels: the h2c replication
listener (follower fetches, forwarded produce and reads: :mod:`cluster.forwarding`) and the
public HTTP API (group and admin calls passed on by :mod:`api.proxy`). Both carry the header
``Logbus-Cluster-Credential``: ``HMAC-SHA256(cluster secret, LABEL)`` in hex. The cluster
secret (32 random bytes, :meth:`cluster.security_store.SecurityStore.ensure_cluster_secret`)
lives in the metadata store, which only brokers read, so only a broker can compute it; a
user's API key, Basic login, JWT or scoped token is never accepted on these paths.

The credential is derived (not the secret itself) so that the value on the wire, were it ever
logged, signs nothing: scoped tokens are HMACs of their payloads under the same secret, and a
fixed label cannot collide with a token payload (those start ``lbt.``). Every secret the store
still keeps verifies (rotation: a broker that has not reloaded yet still gets in); the newest
signs.

:class:`ClusterCredential` is mutable and shared: the API layer sets its secrets on every
security snapshot. Before the first snapshot it has no secret and refuses everything (a broker
with authentication on never serves replication unauthenticated, not even while starting).
``None`` where a credential is expected means authentication is off: nothing is checked.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Sequence
from typing import Final

HEADER: Final = "logbus-cluster-credential"
LABEL: Final = b"logbus inter-broker credential v1"
MAX_CREDENTIAL_CHARS: Final = 128  # a hex SHA-256 is 64; anything longer is not ours


def derive(secret: bytes) -> str:
    return hmac.new(secret, LABEL, hashlib.sha256).hexdigest()


class ClusterCredential:
    """The credential this broker sends and the ones it accepts (see the module doc)."""

    def __init__(self, secrets: Sequence[bytes] = ()) -> None:
        self._current: str | None = None
        self._accepted: tuple[bytes, ...] = ()
        self.set_secrets(secrets)

    def set_secrets(self, secrets: Iterable[bytes]) -> None:
        """The cluster secrets, newest first (``SecuritySnapshot.secrets``)."""
        derived = [derive(s) for s in secrets]
        self._current = derived[0] if derived else None
        self._accepted = tuple(d.encode() for d in derived)

    @property
    def ready(self) -> bool:
        return self._current is not None

    def value(self) -> str | None:
        """What to send (None before the first secret is known)."""
        return self._current

    def headers(self) -> list[tuple[str, str]]:
        return [(HEADER, self._current)] if self._current is not None else []

    def valid(self, presented: str | bytes | None) -> bool:
        """Whether ``presented`` is a credential of this cluster; constant time per secret."""
        if presented is None or len(presented) > MAX_CREDENTIAL_CHARS:
            return False
        raw = presented.encode("latin-1") if isinstance(presented, str) else presented
        ok = False
        for accepted in self._accepted:  # every one: timing does not tell which matched
            ok |= hmac.compare_digest(accepted, raw)
        return ok

    def valid_headers(self, headers: Iterable[tuple[str, str]]) -> bool:
        return self.valid(next((v for k, v in headers if k.lower() == HEADER), None))
