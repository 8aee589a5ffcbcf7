"""Every cap of ``auth_quotas`` in one place, with its reason.

Authentication input arrives before we know who is asking, so each of these bounds the work an
anonymous client can make the broker do with one request.
"""

from __future__ import annotations

# --- names (ACLs, principals) --------------------------------------------------------------
# Topic, group and transactional-id names follow the broker's topic rule: 1..249 of
# [a-zA-Z0-9._-] (Kafka's limit, so a name fits a 255-byte file name with a partition suffix).
MAX_RESOURCE_NAME_CHARS = 249
# A principal is "User:<name>"; names come from users, JWT subjects or certificate subjects
# (an RFC 4514 DN is rarely over 200 characters); 255 keeps a principal one index row.
MAX_PRINCIPAL_CHARS = 255
# An ACL set past this is a configuration mistake (Kafka clusters with 10k+ ACLs exist but
# generate them per tenant; one broker's authorizer index stays under ~10 MB at this size).
MAX_ACLS = 100_000

# --- headers and tokens ---------------------------------------------------------------------
# The whole Authorization header value. A JWT with a few dozen claims is 1-2 KB; RS4096-signed
# ones ~3 KB. 8 KiB is also the common front-proxy header limit (nginx large_client_header).
MAX_AUTHORIZATION_HEADER_BYTES = 8192
# A JWT passed to PyJWT: parsing cost is linear in size; the header limit already caps it.
MAX_JWT_BYTES = 8192
# A JWKS file: a few keys of ~1 KB each; 1 MiB bounds a misconfigured path (e.g. a log file).
MAX_JWKS_BYTES = 1 << 20
# A scoped token travels in a URL query string; browsers and proxies accept ~8 KB URLs.
MAX_SCOPED_TOKEN_BYTES = 4096
# Topics one scoped token may name (an SSE/WebSocket subscription of a dashboard).
MAX_SCOPED_TOKEN_TOPICS = 64
# A scoped token lives minutes, not hours: it sits in browser history and proxy logs.
SCOPED_TOKEN_TTL_MS_DEFAULT = 5 * 60_000
SCOPED_TOKEN_TTL_MS_MAX = 60 * 60_000

# --- API keys ------------------------------------------------------------------------------
KEY_ID_BYTES = 8  # 16 hex characters: unique among millions of keys (birthday bound ~2^32)
KEY_SECRET_BYTES = 32  # 256 bits from `secrets`: brute force is not a concern, hashing or not
# Verified keys remembered per broker; each entry is ~200 bytes, so 10k entries is ~2 MB.
VERIFIED_KEY_CACHE_ENTRIES = 10_000
# A cached verification is trusted this long even without a revocation notice (the wiring
# invalidates on revocation within a second; this bounds the damage of a missed notice).
VERIFIED_KEY_CACHE_TTL_MS = 5 * 60_000

# --- quotas ---------------------------------------------------------------------------------
# Entities with their own sampled rate on one broker (Kafka expires idle sensors after 1 h;
# the wiring evicts least recently used ones past this many).
MAX_QUOTA_SENSORS = 100_000
