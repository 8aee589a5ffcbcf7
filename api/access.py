"""What every route needs, declared in one table, and the one place that enforces it.

Theory of operation
-------------------
:data:`TABLE` maps each (method, path template) the broker serves — every operation of the
OpenAPI document, the WebSocket endpoint, the docs, ``/metrics`` and the health probes — to a
:class:`Rule`: ``public``, ``authenticated`` (any valid credential; the route filters or checks
further itself), or an ACL operation on a resource named by a path parameter (Kafka's
operation for the matching request type). A route missing from the table fails
``tests/api/test_access.py``, which lists the app's routes from the app itself.

:class:`Access` runs in :class:`api.fastpath.FastPath` for every HTTP request and WebSocket
upgrade, after the browser checks and before anything else (the fast path, the proxy,
FastAPI): it authenticates (:meth:`api.security.Security.authenticate`), finds the rule (a
dict lookup by method and segment count, then a comparison of the literal segments of the 1-5
templates of that shape) and decides with the ACLs — a few dict lookups in all. A repeat of a
request admitted since the last security snapshot is decided without a coroutine
(:meth:`Access.admit`, one lookup); everything else, and every refusal, goes through
:meth:`Access.check`. The identity
is left in the scope (``scope["logbus.identity"]``) for the routes that filter listings or
check names found in a body (``body`` in the rule says which).

Answers follow Kafka: no or a bad credential is 401 ``SASL_AUTHENTICATION_FAILED`` with
``WWW-Authenticate``; a denial is 403 with the resource type's code
(``TOPIC_AUTHORIZATION_FAILED`` …), except that a topic the principal may not even describe
answers 404 ``UNKNOWN_TOPIC_OR_PARTITION`` for everything but produce, fetch and create (as
Kafka's metadata, delete and config requests do), so its existence does not leak. A refused
WebSocket is accepted and closed at once with 4401 or 4403 and a reason (a browser sees no
status of a refused upgrade).

A request that sends no credential over a TLS connection whose client certificate was
verified (``ssl_client_auth``) is the certificate's user (:func:`api.connections.peer_user`),
as Kafka's SSL listener makes the subject the principal; a header or token sent with it wins.

Forwarded requests: a broker passing a request on (:mod:`api.proxy`) sends the cluster
credential (:mod:`cluster.interbroker`) and the original principal in ``Logbus-Principal``.
That header is believed only with a valid credential; from anyone else it is removed before
the request goes further, and a bad credential is a 401.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import parse_qsl

from starlette.types import Receive, Scope, Send

from auth_quotas.acl import (
    CLUSTER,
    Operation,
    Resource,
    ResourceType,
    authorization_error,
    validate_principal,
)
from auth_quotas.credentials import PEER_USER_SCOPE_KEY, Identity
from auth_quotas.errors import (
    AuthenticationError,
    InvalidAclError,
    InvalidCredentialsError,
    www_authenticate,
)
from cluster.interbroker import HEADER as CREDENTIAL_HEADER
from core_log.errors import ErrorCode, LogbusError, UnknownTopicOrPartitionError

from .guard import replace_headers, request_headers
from .problems import PROBLEM_JSON, problem_bytes
from .security import ANONYMOUS_IDENTITY, PRINCIPAL_HEADER, PRINCIPAL_TOPICS_HEADER, Security

IDENTITY_KEY: Final = "logbus.identity"
CLOSE_UNAUTHENTICATED: Final = 4401
CLOSE_FORBIDDEN: Final = 4403
_CREDENTIAL = CREDENTIAL_HEADER.encode()
_PRINCIPAL = PRINCIPAL_HEADER.encode()
_PRINCIPAL_TOPICS = PRINCIPAL_TOPICS_HEADER.encode()
_BROKER_ONLY: Final = frozenset({_PRINCIPAL, _PRINCIPAL_TOPICS, b"logbus-forwarded-by"})
# What only a broker sends: a request carrying any of these is decided by Access.check.
_FROM_A_BROKER: Final = _BROKER_ONLY | {_CREDENTIAL}
FROM_A_BROKER_NAMES: Final = frozenset(n.decode("latin-1") for n in _FROM_A_BROKER)


class Kind(enum.Enum):
    PUBLIC = "public"
    AUTHENTICATED = "authenticated"
    RESOURCE = "resource"


@dataclass(frozen=True, slots=True)
class Rule:
    """What a route needs. ``param``: the path parameter naming the resource (None: the
    cluster). ``body``: what the route itself checks in the request body, for the reader
    and the table test (empty: nothing)."""

    kind: Kind
    operation: Operation | None = None
    resource_type: ResourceType | None = None
    param: str | None = None
    body: str = ""

    def resource(self, params: Mapping[str, str]) -> Resource:
        assert self.resource_type is not None
        if self.param is None:
            return CLUSTER
        return Resource(self.resource_type, params[self.param])

    @property
    def hides(self) -> bool:
        """A topic the principal may not describe answers 404 (see :data:`HIDING`)."""
        return self.resource_type is ResourceType.TOPIC and self.operation in HIDING


# Operations on an existing topic that answer "unknown topic" to a principal who may not
# describe it (Kafka's DeleteTopics, CreatePartitions, DescribeConfigs, AlterConfigs,
# ListOffsets); produce, fetch and create answer TOPIC_AUTHORIZATION_FAILED, which tells
# nothing about existence either.
HIDING: Final = frozenset(
    {
        Operation.DESCRIBE,
        Operation.DESCRIBE_CONFIGS,
        Operation.ALTER,
        Operation.ALTER_CONFIGS,
        Operation.DELETE,
    }
)

PUBLIC = Rule(Kind.PUBLIC)
AUTHENTICATED = Rule(Kind.AUTHENTICATED)


def authenticated(body: str) -> Rule:
    return Rule(Kind.AUTHENTICATED, body=body)


def topic(op: Operation, body: str = "") -> Rule:
    return Rule(Kind.RESOURCE, op, ResourceType.TOPIC, "topic", body)


def group(op: Operation, body: str = "") -> Rule:
    return Rule(Kind.RESOURCE, op, ResourceType.GROUP, "group", body)


def txn(op: Operation, body: str = "") -> Rule:
    return Rule(Kind.RESOURCE, op, ResourceType.TRANSACTIONAL_ID, "transactional_id", body)


def cluster(op: Operation, body: str = "") -> Rule:
    return Rule(Kind.RESOURCE, op, ResourceType.CLUSTER, None, body)


Op = Operation
T = "/v1/topics/{topic}"
G = "/v1/groups/{group}"
M = G + "/members/{member}"

# Kafka's request → operation mapping, path by path (KIP-11 and KafkaApis): produce WRITE
# topic, fetch READ topic, ListOffsets/Metadata DESCRIBE topic, CreateTopics CREATE (cluster
# or topic), DeleteTopics DELETE, CreatePartitions ALTER, (Incremental)AlterConfigs
# ALTER_CONFIGS, DescribeConfigs DESCRIBE_CONFIGS, AlterPartitionReassignments ALTER cluster,
# JoinGroup/Heartbeat/LeaveGroup/OffsetCommit/OffsetFetch READ group, DescribeGroups DESCRIBE
# group, DeleteGroups DELETE group, Create/DeleteAcls ALTER cluster, DescribeAcls DESCRIBE
# cluster, user credential changes ALTER cluster and their listings DESCRIBE cluster.
TABLE: Final[dict[tuple[str, str], Rule]] = {
    ("POST", "/v1/topics"): authenticated("CREATE on the cluster or on the topic named"),
    ("GET", "/v1/topics"): authenticated("lists only topics the principal may describe"),
    ("GET", T): topic(Op.DESCRIBE),
    ("DELETE", T): topic(Op.DELETE),
    ("GET", T + "/configs"): topic(Op.DESCRIBE_CONFIGS),
    ("PATCH", T + "/configs"): topic(Op.ALTER_CONFIGS),
    ("POST", T + "/partitions"): topic(Op.ALTER),
    ("GET", T + "/partitions"): topic(Op.DESCRIBE),
    ("PUT", T + "/partitions/{partition}/replicas"): cluster(Op.ALTER),
    ("DELETE", T + "/partitions/{partition}/replicas"): cluster(Op.ALTER),
    ("GET", T + "/partitions/{partition}/offsets"): topic(Op.DESCRIBE),
    ("POST", T + "/records"): topic(Op.WRITE),
    ("POST", T + "/partitions/{partition}/records"): topic(Op.WRITE),
    ("GET", T + "/partitions/{partition}/records"): topic(Op.READ),
    ("POST", "/v1/producers"): authenticated("WRITE on the transactional_id named, if any"),
    ("POST", G + "/members"): group(Op.READ, "READ on every topic subscribed"),
    ("POST", M + "/heartbeat"): group(Op.READ),
    ("DELETE", M): group(Op.READ),
    ("GET", M + "/records"): group(Op.READ),
    ("POST", G + "/offsets"): group(Op.READ, "READ on every topic committed"),
    ("GET", G + "/offsets"): group(Op.DESCRIBE),
    ("POST", G + "/offsets/reset"): group(Op.READ, "READ on every topic reset"),
    ("GET", "/v1/groups"): authenticated("lists only groups the principal may describe"),
    ("GET", G): group(Op.DESCRIBE),
    ("DELETE", G): group(Op.DELETE),
    ("POST", "/v1/transactions/{transactional_id}"): txn(Op.WRITE),
    ("GET", "/v1/transactions/{transactional_id}"): txn(Op.DESCRIBE),
    ("POST", "/v1/transactions/{transactional_id}/commit"): txn(Op.WRITE),
    ("POST", "/v1/transactions/{transactional_id}/abort"): txn(
        Op.WRITE, "without a producer session: an admin abort, ALTER on the cluster"
    ),
    ("POST", "/v1/transactions/{transactional_id}/offsets"): txn(
        Op.WRITE, "READ on the group and on every topic committed"
    ),
    ("GET", "/v1/transactions"): authenticated("lists only ids the principal may describe"),
    ("POST", "/v1/transactions"): authenticated(
        "WRITE on the transactional id and on every topic written; READ on the group and the "
        "topics of its offsets"
    ),
    ("GET", "/v1/cluster"): AUTHENTICATED,  # brokers and their URLs: every client routes by it
    ("POST", "/v1/cluster/brokers/{broker_id}/drain"): cluster(Op.ALTER),
    ("POST", "/v1/users"): cluster(Op.ALTER),
    ("GET", "/v1/users"): cluster(Op.DESCRIBE),
    ("DELETE", "/v1/users/{user}"): cluster(Op.ALTER),
    ("POST", "/v1/users/{user}/keys"): cluster(Op.ALTER),
    ("GET", "/v1/users/{user}/keys"): cluster(Op.DESCRIBE),
    ("DELETE", "/v1/users/{user}/keys/{key_id}"): cluster(Op.ALTER),
    ("POST", "/v1/acls"): cluster(Op.ALTER),
    ("GET", "/v1/acls"): cluster(Op.DESCRIBE),
    ("DELETE", "/v1/acls"): cluster(Op.ALTER),
    ("POST", "/v1/tokens"): authenticated("READ on every topic the token names"),
    # Kafka's AlterClientQuotas / DescribeClientQuotas: ALTER_CONFIGS / DESCRIBE_CONFIGS cluster
    ("PUT", "/v1/quotas"): cluster(Op.ALTER_CONFIGS),
    ("GET", "/v1/quotas"): cluster(Op.DESCRIBE_CONFIGS),
    ("DELETE", "/v1/quotas"): cluster(Op.ALTER_CONFIGS),
    ("GET", "/v1/whoami"): AUTHENTICATED,
    ("WEBSOCKET", "/v1/ws"): authenticated("per message: see WS_MESSAGES"),
    ("GET", "/metrics"): cluster(Op.DESCRIBE),  # labels name topics
    ("GET", "/healthz"): PUBLIC,
    ("GET", "/readyz"): PUBLIC,
    ("GET", "/docs"): PUBLIC,
    ("GET", "/docs/oauth2-redirect"): PUBLIC,
    ("GET", "/redoc"): PUBLIC,
    ("GET", "/openapi.json"): PUBLIC,
}
# What each WebSocket message needs, on the resources it names (api.ws checks them per
# message with :func:`ws_requirements`; a message type missing here fails
# tests/api/test_access.py). Kafka's: a subscription or a group member fetches (READ topic,
# READ group), a commit is an OffsetCommit (READ group and topics), a produce WRITE.
WS_MESSAGES: Final[dict[str, tuple[tuple[Op, ResourceType], ...]]] = {
    "subscribe": ((Op.READ, ResourceType.TOPIC),),
    "join": ((Op.READ, ResourceType.GROUP), (Op.READ, ResourceType.TOPIC)),
    "commit": ((Op.READ, ResourceType.GROUP), (Op.READ, ResourceType.TOPIC)),
    "produce": ((Op.WRITE, ResourceType.TOPIC),),
    "credit": (),
    "ack": (),
    "unsubscribe": (),
    "ping": (),
}


def ws_requirements(
    message: str, topics: Iterable[str] = (), group: str | None = None
) -> list[tuple[Op, Resource]]:
    """The (operation, resource) pairs a WebSocket ``message`` naming ``topics`` and
    ``group`` needs, in a stable order (group first, then topics by name)."""
    needed = []
    for op, resource_type in WS_MESSAGES[message]:
        if resource_type is ResourceType.GROUP:
            names = [] if group is None else [group]
        else:
            names = sorted(set(topics))
        needed += [(op, Resource(resource_type, name)) for name in names]
    return needed


# Mounted static files (the offline docs UI's scripts): public, by prefix.
PUBLIC_PREFIXES: Final = ("/static-offline-docs/",)
# Requests no template matches (404/405 from the app) still need a credential: an
# unauthenticated client learns nothing about which paths exist.
UNMATCHED = AUTHENTICATED


_Entry = tuple[tuple[str | None, ...], tuple[str | None, ...], Rule]  # literals, params, rule
# A request's rule, its path parameters and the resource it names (None: no RESOURCE rule).
_Match = tuple[Rule, dict[str, str], Resource | None]


def _compile() -> dict[tuple[str, int], list[_Entry]]:
    index: dict[tuple[str, int], list[_Entry]] = {}
    for (method, template), rule in TABLE.items():
        parts = template.strip("/").split("/")
        literals = tuple(None if p.startswith("{") else p for p in parts)
        params = tuple(p[1:-1] if p.startswith("{") else None for p in parts)
        index.setdefault((method, len(parts)), []).append((literals, params, rule))
    return index


_INDEX = _compile()


_MATCHED: dict[tuple[str, str], _Match] = {}
MATCH_CACHE_ENTRIES = 4096  # distinct (method, path) remembered; clients repeat theirs


def match(method: str, path: str) -> tuple[Rule, dict[str, str]]:
    """The rule of a request and its path parameters (:data:`UNMATCHED` if none); a
    remembered answer for a path seen before (the returned dict must not be changed)."""
    rule, params, _ = _matched(method, path)
    return rule, params


def _matched(method: str, path: str) -> _Match:
    """:func:`match` and the resource the rule names, remembered with it (a request's
    resource is built once per path, not once per request)."""
    key = (method, path)
    hit = _MATCHED.get(key)
    if hit is None:
        rule, params = _match(method, path)
        resource = rule.resource(params) if rule.kind is Kind.RESOURCE else None
        hit = (rule, params, resource)
        if len(_MATCHED) >= MATCH_CACHE_ENTRIES:
            _MATCHED.clear()
        _MATCHED[key] = hit
    return hit


def _match(method: str, path: str) -> tuple[Rule, dict[str, str]]:
    if path.startswith(PUBLIC_PREFIXES):
        return PUBLIC, {}
    if method == "HEAD":
        method = "GET"
    parts = path.strip("/").split("/")
    for literals, params, rule in _INDEX.get((method, len(parts)), ()):
        if all(s is None or s == p for s, p in zip(literals, parts, strict=True)):
            if rule.kind is not Kind.RESOURCE or rule.param is None:
                return rule, {}
            return rule, {n: p for n, p in zip(params, parts, strict=True) if n is not None}
    return UNMATCHED, {}


def identity_of(scope: Mapping[str, Any]) -> Identity:
    """The identity :class:`Access` found for this request (anonymous without auth)."""
    identity: Identity = scope.get(IDENTITY_KEY, ANONYMOUS_IDENTITY)
    return identity


def hidden_topic(name: str) -> LogbusError:
    """What a topic the principal may not describe looks like: a missing one."""
    return UnknownTopicOrPartitionError(f"unknown topic {name!r}", topic=name)


def require(
    security: Security | None, scope: Mapping[str, Any], op: Operation, resource: Resource
) -> None:
    """For routes checking names found in a body: raise the 403 (or, for a topic the
    principal may not describe, outside produce/fetch, the 404) when denied."""
    if security is None or not security.enabled:
        return
    identity = identity_of(scope)
    if security.allowed(identity, op, resource):
        return
    security.count_denial(resource.type)
    if (
        resource.type is ResourceType.TOPIC
        and op in HIDING
        and not security.allowed(identity, Operation.DESCRIBE, resource)
    ):
        raise hidden_topic(resource.name)
    raise authorization_error(op, resource)


def require_transactional(
    security: Security | None, scope: Mapping[str, Any], transactional_id: str
) -> None:
    """Kafka's rule for a transactional producer's every call: WRITE on its transactional id
    (a produce also needs WRITE on the topic, from the table)."""
    require(
        security, scope, Operation.WRITE, Resource(ResourceType.TRANSACTIONAL_ID, transactional_id)
    )


class Access:
    """The enforcement (see the module docstring); ``security`` is set by the app's lifespan."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.security: Security | None = None

    def admit(self, scope: Scope) -> bool:
        """The common request decided without a coroutine: HTTP, an ``Authorization`` value
        verified since the last security snapshot (:meth:`Security.known`), no header only a
        broker sends, and a rule the principal passes (the ACL decision remembered until the
        next snapshot). True: admitted, its identity in the scope, exactly as :meth:`check`
        would leave it. False: not decided here, :meth:`check` decides (a first sight, any
        other credential, a denial: each answered and counted there, as before). Revocation
        is as prompt as in :meth:`check`: both read the same caches, which every snapshot
        empties."""
        security = self.security
        if security is None or scope["type"] != "http":
            return False
        # The request's headers as the front door decoded them once (the last of a repeated
        # one, as the loop over the raw list this replaced kept).
        headers = request_headers(scope)
        if not FROM_A_BROKER_NAMES.isdisjoint(headers):
            return False
        method: str = scope["method"]
        path: str = scope["path"]
        authorization = headers.get("authorization")
        if not authorization:
            return _matched(method, path)[0].kind is Kind.PUBLIC
        identity = security.admitted(authorization, method, path)
        if identity is None:
            rule, _, resource = _matched(method, path)
            if rule.kind is Kind.PUBLIC:
                return True
            known = security.known(authorization)
            if known is None:
                return False
            identity = known[0]
            if identity.topics is not None:  # a scoped token: check() decides
                return False
            if resource is not None:
                assert rule.operation is not None
                if not security.allowed(identity, rule.operation, resource):
                    return False
            security.admit_again(authorization, method, path, identity, known[1])
        scope[IDENTITY_KEY] = identity
        return True

    async def check(self, scope: Scope, receive: Receive, send: Send) -> bool:
        """True: go on (the identity is in the scope). False: refused, the answer was sent."""
        if not self.enabled:
            return True
        security = self.security
        kind = scope["type"]
        method = "WEBSOCKET" if kind == "websocket" else scope["method"]
        rule, _, resource = _matched(method, scope["path"])
        if rule.kind is Kind.PUBLIC:
            return True
        if security is None:
            error = LogbusError("the broker is starting", code=ErrorCode.BROKER_BUSY)
            await _refuse(scope, receive, send, error, 503, CLOSE_FORBIDDEN)
            return False
        try:
            identity = await self._identify(security, scope, method)
        except AuthenticationError as e:
            security.count_failure(e)
            await _refuse(scope, receive, send, e, 401, CLOSE_UNAUTHENTICATED)
            return False
        scope[IDENTITY_KEY] = identity
        if rule.kind is Kind.AUTHENTICATED or resource is None:
            return True
        assert rule.operation is not None
        if security.allowed(identity, rule.operation, resource):
            return True
        security.count_denial(resource.type)
        if rule.hides and not security.allowed(identity, Operation.DESCRIBE, resource):
            error = hidden_topic(resource.name)
        else:
            error = authorization_error(rule.operation, resource)
        await _refuse(scope, receive, send, error, error.http_status, CLOSE_FORBIDDEN)
        return False

    async def _identify(self, security: Security, scope: Scope, method: str) -> Identity:
        authorization: str | None = None
        credential: bytes | None = None
        principal: bytes | None = None
        topics: bytes | None = None
        broker_only = False
        for name, value in scope["headers"]:
            if name == b"authorization":
                authorization = value.decode("latin-1")
            elif name in _FROM_A_BROKER:
                broker_only = True
                if name == _CREDENTIAL:
                    credential = value
                elif name == _PRINCIPAL:
                    principal = value
                elif name == _PRINCIPAL_TOPICS:
                    topics = value
        if credential is not None:
            return _forwarded(security, credential, principal, topics)
        # Only a broker may say on whose behalf it asks, or that it forwards a request (which
        # the quota gate then does not measure again: api.quota_gate.serve).
        if broker_only:  # rare: copy only then
            replace_headers(scope, [(k, v) for k, v in scope["headers"] if k not in _BROKER_ONLY])
        query_token = None
        if not authorization and method in ("GET", "WEBSOCKET"):
            query_token = _query_token(scope)
        if not authorization and not query_token:
            peer = scope.get(PEER_USER_SCOPE_KEY)  # a verified client certificate's (mTLS)
            if peer is not None:
                return Identity(peer, "mtls")
        identity = await security.authenticate(authorization, query_token)
        if identity.topics is not None and method not in ("GET", "WEBSOCKET"):
            raise InvalidCredentialsError("a scoped token only reads (GET, WebSocket)")
        return identity


def _forwarded(
    security: Security, credential: bytes, principal: bytes | None, topics: bytes | None
) -> Identity:
    """A broker's request on behalf of ``principal`` (limited to ``topics`` when the original
    credential was a scoped token)."""
    if security.credential is None or not security.credential.valid(credential):
        raise InvalidCredentialsError("not a valid cluster credential")
    if principal is None:
        raise InvalidCredentialsError("a forwarded request names its principal")
    try:
        text = validate_principal(principal.decode("utf-8"))
        scoped = None if topics is None else frozenset(topics.decode("utf-8").split(","))
    except (InvalidAclError, UnicodeDecodeError):
        raise InvalidCredentialsError("a forwarded request's principal is not valid") from None
    return Identity(text.partition(":")[2], "internal", topics=scoped)


def _query_token(scope: Scope) -> str | None:
    raw: bytes = scope.get("query_string", b"")
    if b"token=" not in raw:
        return None
    for key, value in parse_qsl(raw.decode("latin-1"), keep_blank_values=True):
        if key == "token":
            return value
    return None


async def _refuse(
    scope: Scope, receive: Receive, send: Send, error: LogbusError, status: int, close: int
) -> None:
    if scope["type"] == "websocket":
        # Accept, then close with the code: a browser sees no status of a refused upgrade.
        message = await receive()
        if message["type"] != "websocket.connect":
            return
        await send({"type": "websocket.accept"})
        await send({"type": "websocket.close", "code": close, "reason": error.message[:120]})
        return
    body = problem_bytes(error)
    headers = [
        (b"content-type", PROBLEM_JSON.encode()),
        (b"content-length", str(len(body)).encode()),
    ]
    if isinstance(error, AuthenticationError):
        headers.append((b"www-authenticate", www_authenticate(error).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
