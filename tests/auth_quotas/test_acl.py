# ruff: noqa: E501  (the table of cases reads best one case a line)
"""ACL evaluation: Kafka's cases as a table, the index against a plain reference (Hypothesis),
validation of untrusted input, and the cost of a decision against 100+ ACLs."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from auth_quotas.acl import (
    CLUSTER,
    Acl,
    AclSet,
    Operation,
    PatternType,
    Permission,
    Reason,
    Resource,
    ResourceType,
    authorization_error,
    authorize,
    describable,
    parse_acl,
    principal_for,
)
from auth_quotas.errors import InvalidAclError
from core_log.errors import ErrorCode

T = ResourceType.TOPIC
G = ResourceType.GROUP
LIT = PatternType.LITERAL
PRE = PatternType.PREFIXED
ALLOW = Permission.ALLOW
DENY = Permission.DENY
Op = Operation
NONE = Reason.NO_MATCHING_ACL
OK = Reason.ALLOW_ACL
NO = Reason.DENY_ACL
TX = ResourceType.TRANSACTIONAL_ID


def acl(
    principal: str,
    op: Operation,
    name: str,
    permission: Permission = ALLOW,
    pattern: PatternType = LIT,
    rtype: ResourceType = T,
) -> Acl:
    return Acl(principal, rtype, name, pattern, op, permission)


def topic(name: str) -> Resource:
    return Resource(T, name)


ALICE = "User:alice"
BOB = "User:bob"

# (ACLs, principal, operation, resource, expected allowed, expected reason)
CASES = [
    ([], ALICE, Op.READ, topic("orders"), False, NONE),
    ([acl(ALICE, Op.READ, "orders")], ALICE, Op.READ, topic("orders"), True, OK),
    ([acl(ALICE, Op.READ, "orders")], BOB, Op.READ, topic("orders"), False, NONE),
    ([acl(ALICE, Op.READ, "orders")], ALICE, Op.WRITE, topic("orders"), False, NONE),
    ([acl(ALICE, Op.READ, "orders")], ALICE, Op.READ, topic("orders2"), False, NONE),
    # literal "*" matches every name; User:* every principal
    ([acl(ALICE, Op.READ, "*")], ALICE, Op.READ, topic("anything"), True, OK),
    ([acl("User:*", Op.READ, "orders")], BOB, Op.READ, topic("orders"), True, OK),
    # prefixed
    ([acl(ALICE, Op.WRITE, "ord", pattern=PRE)], ALICE, Op.WRITE, topic("orders"), True, OK),
    ([acl(ALICE, Op.WRITE, "ord", pattern=PRE)], ALICE, Op.WRITE, topic("ord"), True, OK),
    ([acl(ALICE, Op.WRITE, "ord", pattern=PRE)], ALICE, Op.WRITE, topic("or"), False, NONE),
    # a literal ACL is not a prefix
    ([acl(ALICE, Op.WRITE, "ord")], ALICE, Op.WRITE, topic("orders"), False, NONE),
    # deny wins over allow, whatever matched the allow
    ([acl(ALICE, Op.READ, "orders"), acl(ALICE, Op.READ, "orders", DENY)], ALICE, Op.READ, topic("orders"), False, NO),
    ([acl(ALICE, Op.ALL, "*"), acl("User:*", Op.READ, "sec", DENY, PRE)], ALICE, Op.READ, topic("secret"), False, NO),
    ([acl(ALICE, Op.READ, "orders"), acl(BOB, Op.READ, "orders", DENY)], ALICE, Op.READ, topic("orders"), True, OK),
    # implied describe (ALLOW only) and describe_configs
    ([acl(ALICE, Op.READ, "orders")], ALICE, Op.DESCRIBE, topic("orders"), True, OK),
    ([acl(ALICE, Op.WRITE, "orders")], ALICE, Op.DESCRIBE, topic("orders"), True, OK),
    ([acl(ALICE, Op.DELETE, "orders")], ALICE, Op.DESCRIBE, topic("orders"), True, OK),
    ([acl(ALICE, Op.ALTER, "orders")], ALICE, Op.DESCRIBE, topic("orders"), True, OK),
    ([acl(ALICE, Op.CREATE, "orders")], ALICE, Op.DESCRIBE, topic("orders"), False, NONE),
    ([acl(ALICE, Op.ALTER_CONFIGS, "orders")], ALICE, Op.DESCRIBE_CONFIGS, topic("orders"), True, OK),
    ([acl(ALICE, Op.DESCRIBE, "orders")], ALICE, Op.READ, topic("orders"), False, NONE),
    ([acl(ALICE, Op.DESCRIBE_CONFIGS, "orders")], ALICE, Op.ALTER_CONFIGS, topic("orders"), False, NONE),
    ([acl(ALICE, Op.ALTER_CONFIGS, "orders")], ALICE, Op.DESCRIBE, topic("orders"), False, NONE),
    # a DENY of read does not deny describe (Kafka: implication is for ALLOW only) ...
    ([acl(ALICE, Op.READ, "orders"), acl(ALICE, Op.READ, "orders", DENY)], ALICE, Op.DESCRIBE, topic("orders"), True, OK),
    # ... but a DENY of all denies everything
    ([acl(ALICE, Op.ALL, "orders"), acl(ALICE, Op.ALL, "orders", DENY)], ALICE, Op.DESCRIBE, topic("orders"), False, NO),
    ([acl(ALICE, Op.ALL, "orders")], ALICE, Op.ALTER_CONFIGS, topic("orders"), True, OK),
    # resource types are separate namespaces
    ([acl(ALICE, Op.READ, "orders")], ALICE, Op.READ, Resource(G, "orders"), False, NONE),
    ([acl(ALICE, Op.READ, "app", rtype=G, pattern=PRE)], ALICE, Op.READ, Resource(G, "app-1"), True, OK),
    ([acl(ALICE, Op.CREATE, "kafka-cluster", rtype=ResourceType.CLUSTER)], ALICE, Op.CREATE, CLUSTER, True, OK),
    ([acl(ALICE, Op.WRITE, "tx", rtype=TX, pattern=PRE)], ALICE, Op.WRITE, Resource(TX, "tx-1"), True, OK),
]  # fmt: skip


@pytest.mark.parametrize(("acls", "principal", "op", "resource", "allowed", "reason"), CASES)
def test_kafka_cases(
    acls: list[Acl],
    principal: str,
    op: Operation,
    resource: Resource,
    allowed: bool,
    reason: Reason,
) -> None:
    decision = authorize(principal, op, resource, AclSet(acls))
    assert decision.allowed is allowed
    assert bool(decision) is allowed
    assert decision.reason is reason
    if reason in (Reason.ALLOW_ACL, Reason.DENY_ACL):
        assert decision.acl in acls


def test_super_users_are_allowed_even_against_a_deny() -> None:
    acls = AclSet([acl("User:admin", Op.ALL, "*", DENY)])
    decision = authorize("User:admin", Op.DELETE, topic("x"), acls, frozenset({"User:admin"}))
    assert decision.allowed and decision.reason is Reason.SUPER_USER
    assert not authorize("User:admin", Op.DELETE, topic("x"), acls)


def test_allow_everyone_if_no_acl_found_only_for_resources_without_acls() -> None:
    acls = AclSet([acl(BOB, Op.READ, "orders")])
    decision = authorize(ALICE, Op.READ, topic("other"), acls, allow_everyone_if_no_acl_found=True)
    assert decision.allowed and decision.reason is Reason.NO_ACL_FOR_RESOURCE
    # orders has an ACL (for bob): alice is denied even with the flag, as in Kafka
    assert not authorize(ALICE, Op.READ, topic("orders"), acls, allow_everyone_if_no_acl_found=True)
    assert not authorize(ALICE, Op.READ, topic("other"), acls)


def test_describable_filters_a_listing() -> None:
    acls = AclSet(
        [
            acl(ALICE, Op.READ, "pub", pattern=PRE),
            acl(ALICE, Op.WRITE, "orders"),
            acl(ALICE, Op.READ, "public-secret", DENY),
            acl(ALICE, Op.DESCRIBE, "public-hidden", DENY),
        ]
    )
    names = ["orders", "payments", "public-1", "public-secret", "public-hidden"]
    # a DENY of read leaves describe (implied by the prefixed read) in place; a DENY of describe
    # hides the topic
    assert describable(ALICE, T, names, acls) == ["orders", "public-1", "public-secret"]
    assert describable(BOB, T, names, acls) == []
    assert describable(BOB, T, names, acls, frozenset({BOB})) == names


def test_set_is_immutable_and_add_remove_return_new_sets() -> None:
    a, b = acl(ALICE, Op.READ, "x"), acl(BOB, Op.READ, "x")
    s1 = AclSet([a])
    s2 = s1.add(b)
    assert len(s1) == 1 and len(s2) == 2 and b in s2 and b not in s1
    s3 = s2.remove(a)
    assert list(s3) == [b] and authorize(ALICE, Op.READ, topic("x"), s3).allowed is False
    assert s2.select(principal=BOB) == [b]
    assert s2.select(resource_type=G) == []
    assert s2.select(name="x", pattern=LIT) == sorted([a, b], key=lambda z: z.principal)


# --- validation ----------------------------------------------------------------------------

GOOD = {
    "principal": "User:alice",
    "resource_type": "topic",
    "name": "orders",
    "pattern": "literal",
    "operation": "write",
    "permission": "allow",
}


def test_parse_acl_round_trips() -> None:
    parsed = parse_acl(GOOD)
    assert parsed == acl(ALICE, Op.WRITE, "orders")
    assert parse_acl(parsed.to_dict()) == parsed
    assert parse_acl({**GOOD, "pattern": "prefix"}).pattern is PRE
    assert (
        parse_acl({k: v for k, v in GOOD.items() if k not in ("pattern", "permission")}) == parsed
    )
    assert parse_acl({**GOOD, "name": "*"}).name == "*"
    assert parse_acl({**GOOD, "principal": "User:*"}).principal == "User:*"
    cluster = {**GOOD, "resource_type": "cluster", "name": "kafka-cluster", "operation": "alter"}
    assert parse_acl(cluster).resource_type is ResourceType.CLUSTER
    assert principal_for("alice") == ALICE


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"principal": "alice"}, "principal"),
        ({"principal": "Group:x"}, "principal"),
        ({"principal": "User:"}, "principal"),
        ({"principal": "User:a\nb"}, "principal"),
        ({"principal": "User:" + "a" * 300}, "principal"),
        ({"principal": 7}, "principal"),
        ({"resource_type": "table"}, "resource_type"),
        ({"pattern": "regex"}, "pattern"),
        ({"operation": "fly"}, "operation"),
        ({"operation": None}, "operation"),
        ({"permission": "maybe"}, "permission"),
        ({"name": ""}, "name"),
        ({"name": "a b"}, "name"),
        ({"name": "x" * 250}, "name"),
        ({"name": ["x"]}, "name"),
        ({"name": "*", "pattern": "prefixed"}, "name"),
        ({"resource_type": "cluster", "name": "mine"}, "name"),
        ({"extra": 1}, "unknown field"),
    ],
)
def test_parse_acl_refuses_bad_input_with_a_400(change: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidAclError) as info:
        parse_acl({**GOOD, **change})
    assert field in info.value.message
    assert info.value.code is ErrorCode.INVALID_REQUEST and info.value.http_status == 400


@pytest.mark.parametrize("missing", ["principal", "resource_type", "name", "operation"])
def test_parse_acl_requires_fields(missing: str) -> None:
    with pytest.raises(InvalidAclError, match=f"{missing}: required"):
        parse_acl({k: v for k, v in GOOD.items() if k != missing})


def test_parse_acl_refuses_a_non_object() -> None:
    with pytest.raises(InvalidAclError):
        parse_acl(["principal"])  # type: ignore[arg-type]


# --- the index against a plain reference ------------------------------------------------------


def reference(
    principal: str, op: Operation, resource: Resource, acls: list[Acl], supers: frozenset[str]
) -> bool:
    """Kafka's rules, written as plainly as possible over a list."""
    if principal in supers:
        return True
    applicable = []
    for a in acls:
        if a.resource_type != resource.type:
            continue
        if a.pattern == LIT and not (a.name == resource.name or a.name == "*"):
            continue
        if a.pattern == PRE and not resource.name.startswith(a.name):
            continue
        if a.principal not in (principal, "User:*"):
            continue
        applicable.append(a)
    for a in applicable:
        if a.permission == DENY and a.operation in (op, Op.ALL):
            return False
    for a in applicable:
        if a.permission != ALLOW:
            continue
        if a.operation in (op, Op.ALL):
            return True
        if op == Op.DESCRIBE and a.operation in (Op.READ, Op.WRITE, Op.DELETE, Op.ALTER):
            return True
        if op == Op.DESCRIBE_CONFIGS and a.operation == Op.ALTER_CONFIGS:
            return True
    return False


PRINCIPALS = st.sampled_from(["User:alice", "User:bob", "User:carol", "User:*"])
NAMES = st.text("abc", min_size=1, max_size=4)
ACLS = st.builds(
    Acl,
    principal=PRINCIPALS,
    resource_type=st.sampled_from([T, G]),
    name=st.one_of(NAMES, st.just("*")),
    pattern=st.sampled_from([LIT, PRE]),
    operation=st.sampled_from(list(Operation)),
    permission=st.sampled_from([ALLOW, DENY]),
).filter(lambda a: not (a.name == "*" and a.pattern is PRE))


QUERY_NAMES = ["a", "b", "ab", "ba", "abc", "cab", "aaaa"]


@settings(max_examples=40, deadline=None)
@given(
    acls=st.lists(ACLS, max_size=25),
    supers=st.sets(st.sampled_from(["User:alice", "User:dave"]), max_size=1),
)
def test_index_agrees_with_reference(acls: list[Acl], supers: set[str]) -> None:
    """Each example checks every (principal, operation, resource) against the reference."""
    indexed = AclSet(acls)
    for principal in ("User:alice", "User:bob", "User:carol"):
        for op in Operation:
            if op is Op.ALL:
                continue
            for rtype in (T, G):
                for name in QUERY_NAMES:
                    resource = Resource(rtype, name)
                    expected = reference(principal, op, resource, acls, frozenset(supers))
                    decision = authorize(principal, op, resource, indexed, frozenset(supers))
                    assert decision.allowed is expected, (principal, op, resource)


@settings(max_examples=25, deadline=None)
@given(acls=st.lists(ACLS, max_size=20), extra=ACLS, name=NAMES)
def test_adding_a_deny_never_allows_more_and_an_allow_never_denies_more(
    acls: list[Acl], extra: Acl, name: str
) -> None:
    before = AclSet(acls)
    after = before.add(extra)
    for op in Operation:
        was = authorize(ALICE, op, Resource(extra.resource_type, name), before).allowed
        now = authorize(ALICE, op, Resource(extra.resource_type, name), after).allowed
        if extra.permission is DENY:
            assert now <= was
        else:
            assert now >= was


def test_a_decision_against_hundreds_of_acls_is_microseconds() -> None:
    """Not a timing assertion on absolute speed: the index must make the decision cost
    independent of the ACL count (a linear scan of 2000 ACLs would be ~20x slower)."""
    small = AclSet([acl(f"User:u{i}", Op.READ, f"t{i}") for i in range(100)])
    big = AclSet(
        [acl(f"User:u{i}", Op.READ, f"t{i}") for i in range(2000)]
        + [acl(f"User:u{i}", Op.WRITE, f"p{i}-", pattern=PRE) for i in range(200)]
    )

    def cost(acls: AclSet) -> float:
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(2000):
                authorize("User:u7", Op.READ, topic("t7"), acls)
            best = min(best, time.perf_counter() - start)
        return best

    assert authorize("User:u7", Op.READ, topic("t7"), big).allowed
    assert cost(big) < cost(small) * 5


@pytest.mark.parametrize(
    ("rtype", "code"),
    [
        (T, ErrorCode.TOPIC_AUTHORIZATION_FAILED),
        (G, ErrorCode.GROUP_AUTHORIZATION_FAILED),
        (ResourceType.CLUSTER, ErrorCode.CLUSTER_AUTHORIZATION_FAILED),
        (TX, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED),
    ],
)
def test_authorization_errors_carry_kafkas_code_and_403(
    rtype: ResourceType, code: ErrorCode
) -> None:
    error = authorization_error(Op.WRITE, Resource(rtype, "x"))
    assert error.code is code and error.http_status == 403 and not error.retriable
    assert error.detail["resource_name"] == "x" and "write" in error.message
