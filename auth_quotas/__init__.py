"""Authentication, authorization and client quotas: the sans-I/O core (issue 12).

    acl.py          ACLs, the indexed AclSet, and authorize(): one pure decision function
    quotas.py       Kafka's quota precedence, sampled rates, throttle times, KIP-599 buckets
    credentials.py  API keys (argon2 + verified cache), Authorization headers, scoped tokens,
                    JWTs against a JWKS, client-certificate subjects
    errors.py       the error tree (401 / 400 / 429), WWW-Authenticate
    limits.py       every cap of the package, with its reason

Nothing here reads a clock, a socket or the metadata store: the API and cluster layers pass
``now_ms``, stored keys, ACL snapshots and quota configs in, and act on what comes back.
"""
