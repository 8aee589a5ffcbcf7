"""The ``logbus`` client commands against a broker started with ``--auth``: credentials on every
command (``--api-key``, ``--api-key-file``, ``$LOGBUS_API_KEY``) and the security admin commands
(``users``, ``keys``, ``acls``, ``quotas``, ``whoami``).

Most commands run in this process through :func:`api.cli.main` (a subprocess costs about a
second of imports each); produce and consume also run as real ``python -m api.cli``
subprocesses, with the key from the environment and a two-URL ``--url``. One broker serves the
whole module; each test uses its own user and topic names.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from api import cli
from auth_quotas.credentials import generate_api_key
from logbus_client.routing import Router, client_headers
from tests import zygote
from tests.server import BrokerProcess, free_port

ROOT = Path(__file__).resolve().parent.parent
ADMIN_KEY = generate_api_key().token


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    data = tmp_path_factory.mktemp("security-cli") / "data"
    b = BrokerProcess(data, None, "--auth", env={"LOGBUS_BOOTSTRAP_KEY": ADMIN_KEY}).start()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture(autouse=True)
def _env(broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every command here goes to the module's broker, with no key unless a test gives one."""
    monkeypatch.setenv("LOGBUS_URL", broker.url)
    monkeypatch.delenv("LOGBUS_API_KEY", raising=False)


class Run:
    """``logbus ARGV`` in this process: (exit code, stdout, stderr)."""

    def __init__(self, capsys: pytest.CaptureFixture[str]) -> None:
        self.capsys = capsys

    def __call__(self, *argv: str) -> tuple[int, str, str]:
        self.capsys.readouterr()
        try:
            code = cli.main(list(argv))
        except SystemExit as e:  # argparse's usage errors
            code = e.code if isinstance(e.code, int) else 2
        out = self.capsys.readouterr()
        assert "Traceback" not in out.err, out.err
        return code, out.out, out.err

    def ok(self, *argv: str) -> str:
        code, out, err = self(*argv)
        assert code == 0, (argv, code, out, err)
        return out

    def json(self, *argv: str) -> dict[str, object]:
        doc = json.loads(self.ok(*argv, "--json"))
        assert isinstance(doc, dict)
        return doc

    def fails(self, *argv: str, code: int = 1) -> str:
        """The one-line error of a failing command."""
        got, out, err = self(*argv)
        assert got == code, (argv, got, out, err)
        return err

    def admin(self, *argv: str) -> str:
        return self.ok("--api-key", ADMIN_KEY, *argv)


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str]) -> Run:
    return Run(capsys)


def _new_user(run: Run, name: str) -> str:
    """Create ``name`` as the admin; its key, read from the table output (shown once)."""
    out = run.admin("users", "create", name)
    assert f"created user {name}" in out
    found = re.search(r"^\s+(lbk\.\S+)$", out, re.MULTILINE)
    assert found, out
    return found[1]


def _produce(run: Run, tmp_path: Path, key: str, topic: str, lines: str) -> tuple[int, str]:
    """``logbus produce TOPIC`` in this process with ``lines`` on stdin: (exit code, stderr)."""
    src = tmp_path / "stdin.txt"
    src.write_text(lines)
    with src.open() as stdin, pytest.MonkeyPatch.context() as mp:
        mp.setattr(sys, "stdin", stdin)
        code, _, err = run("produce", topic, "--api-key", key, "--linger-ms", "0")
    return code, err


def _subprocess(*argv: str, env: dict[str, str], stdin: str | None = None) -> tuple[int, str, str]:
    r = zygote.run(list(argv), input=stdin, timeout=60, cwd=ROOT, env={**os.environ, **env})
    assert "Traceback" not in r.stderr, r.stderr
    return r.returncode, r.stdout, r.stderr


def test_without_a_key_every_command_is_refused_in_one_line(run: Run) -> None:
    for argv in (["topics", "list"], ["whoami"], ["users", "list"], ["quotas", "list"]):
        err = run.fails(*argv)
        assert err.count("\n") == 1, err
        assert err.startswith(f"logbus {' '.join(argv)}: SASL_AUTHENTICATION_FAILED (401)"), err
        assert "no API key given" in err


def test_the_admin_key_from_env_option_file_and_before_the_command(
    run: Run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key_file = tmp_path / "admin.key"
    key_file.write_text(ADMIN_KEY + "\n")
    assert run.ok("whoami", "--api-key", ADMIN_KEY) == "User:admin (by api_key)\n"
    assert run.ok("whoami", "--api-key-file", str(key_file)) == "User:admin (by api_key)\n"
    assert run.ok("--api-key-file", str(key_file), "whoami").startswith("User:admin ")
    assert run.ok("--api-key", ADMIN_KEY, "topics", "list", "--json")
    assert run.json("whoami", "--api-key", ADMIN_KEY) == {
        "principal": "User:admin",
        "method": "api_key",
        "authenticated": True,
    }
    # The command's own key wins over one before it.
    wrong = generate_api_key().token
    assert run.ok("--api-key", wrong, "whoami", "--api-key-file", str(key_file))
    monkeypatch.setenv("LOGBUS_API_KEY", ADMIN_KEY)
    assert run.ok("whoami").startswith("User:admin ")
    # A refused key is named by where it came from, never shown.
    err = run.fails("whoami", "--api-key", wrong)
    assert "SASL_AUTHENTICATION_FAILED (401)" in err and wrong not in err
    assert "no API key given" not in err


def test_bad_credentials_are_usage_errors_that_do_not_show_the_key(
    run: Run, tmp_path: Path
) -> None:
    secret = "lbk.0123456789abcdef.has a space"
    err = run.fails("whoami", "--api-key", secret, code=2)
    assert "visible ASCII" in err and secret not in err
    err = run.fails("whoami", "--api-key-file", str(tmp_path / "missing"), code=2)
    assert err.startswith("logbus whoami: --api-key-file") and "No such file" in err
    (tmp_path / "empty").write_text("\n")
    assert "empty" in run.fails("whoami", "--api-key-file", str(tmp_path / "empty"), code=2)
    err = run.fails("whoami", "--api-key", ADMIN_KEY, "--api-key-file", "x", code=2)
    assert "not allowed with argument" in err
    with pytest.raises(ValueError, match="visible ASCII") as raised:
        Router("http://127.0.0.1:1", api_key=secret)
    assert secret not in str(raised.value)
    assert client_headers({"user-agent": "t"}, "k") == {
        "user-agent": "t",
        "authorization": "Bearer k",
    }


def test_users_and_keys_create_list_revoke_delete(run: Run) -> None:
    carol = _new_user(run, "carol")
    assert run.ok("whoami", "--api-key", carol) == "User:carol (by api_key)\n"
    assert "carol" in run.admin("users", "list")
    users = run.json("users", "list", "--api-key", ADMIN_KEY)["users"]
    assert isinstance(users, list) and {"carol", "admin"} <= {u["name"] for u in users}

    second = run.json("keys", "create", "carol", "--description", "laptop", "--api-key", ADMIN_KEY)
    assert second["user"] == "carol" and isinstance(second["key"], str)
    listed = run.json("keys", "list", "carol", "--api-key", ADMIN_KEY)["keys"]
    assert isinstance(listed, list) and len(listed) == 2
    assert "laptop" in run.admin("keys", "list", "carol")
    first_id = next(k["key_id"] for k in listed if k["key_id"] != second["key_id"])

    assert run.admin("keys", "revoke", "carol", first_id) == (
        f"revoked key {first_id} of user carol\n"
    )
    assert "SASL_AUTHENTICATION_FAILED (401)" in run.fails("whoami", "--api-key", carol)
    assert run.ok("whoami", "--api-key", str(second["key"])).startswith("User:carol ")
    # An ordinary user may not administer users.
    err = run.fails("users", "list", "--api-key", str(second["key"]))
    assert "CLUSTER_AUTHORIZATION_FAILED (403)" in err and err.count("\n") == 1

    assert "deleted user carol" in run.admin("users", "delete", "carol")
    assert "(401)" in run.fails("whoami", "--api-key", str(second["key"]))
    assert "(404)" in run.fails("users", "delete", "carol", "--api-key", ADMIN_KEY)


def test_acls_decide_what_a_user_may_produce(run: Run, tmp_path: Path) -> None:
    run.admin("topics", "create", "dave-orders")
    dave = _new_user(run, "dave")
    code, err = _produce(run, tmp_path, dave, "dave-orders", "a\nb\n")
    assert code == 1 and "(404)" in err  # a topic dave may not describe looks missing

    added = run.admin(
        "acls", "add", "--principal", "User:dave", "--resource-type", "topic",
        "--name", "dave-", "--pattern", "prefixed", "--operation", "write", "--operation", "read",
    )  # fmt: skip
    assert "added 2 new ACL(s)" in added and "prefixed" in added
    code, err = _produce(run, tmp_path, dave, "dave-orders", "a\nb\n")
    assert code == 0 and "produced 2 record(s)" in err, err

    acls = run.json("acls", "list", "--principal", "User:dave", "--api-key", ADMIN_KEY)["acls"]
    assert isinstance(acls, list)
    assert sorted(a["operation"] for a in acls) == ["read", "write"]
    assert "no ACLs" in run.admin(
        "acls", "list", "--principal", "User:dave", "--operation", "alter"
    )

    removed = run.json(
        "acls", "remove", "--principal", "User:dave", "--operation", "write",
        "--api-key", ADMIN_KEY,
    )["removed"]  # fmt: skip
    assert isinstance(removed, list) and [a["operation"] for a in removed] == ["write"]
    code, err = _produce(run, tmp_path, dave, "dave-orders", "c\n")
    assert code == 1 and "TOPIC_AUTHORIZATION_FAILED (403)" in err, err
    assert err.count("\n") == 2  # the error and how many records were acknowledged (none)


def test_quotas_set_list_delete(run: Run) -> None:
    doc = run.json(
        "quotas", "set", "--user", "erin", "--producer-byte-rate", "1048576",
        "--request-percentage", "50", "--api-key", ADMIN_KEY,
    )  # fmt: skip
    assert doc["quotas"] == [
        {
            "entity": {"user": "erin"},
            "quotas": {"producer_byte_rate": 1048576, "request_percentage": 50},
        }
    ]
    run.admin("quotas", "set", "--user-default", "--client-id", "erin-loader",
              "--consumer-byte-rate", "2048")  # fmt: skip
    table = run.admin("quotas", "list")
    assert re.search(r"^erin\s+-\s+producer_byte_rate\s+1048576$", table, re.MULTILINE), table
    assert re.search(r"^<default>\s+erin-loader\s+consumer_byte_rate\s+2048$", table, re.M), table

    run.admin("quotas", "delete", "--user", "erin", "--quota", "request_percentage")
    listed = run.json("quotas", "list", "--user", "erin", "--api-key", ADMIN_KEY)["quotas"]
    assert listed == [{"entity": {"user": "erin"}, "quotas": {"producer_byte_rate": 1048576}}]
    assert run.admin("quotas", "delete", "--user", "erin") == "deleted all quotas of user=erin\n"
    assert run.admin("quotas", "list", "--user", "erin") == "no quotas\n"
    run.admin("quotas", "delete", "--user-default", "--client-id", "erin-loader")
    listed = run.json("quotas", "list", "--client-id", "erin-loader", "--api-key", ADMIN_KEY)
    assert listed["quotas"] == []


def test_bad_input_is_a_usage_error_or_one_line(run: Run) -> None:
    key = ["--api-key", ADMIN_KEY]
    acl = ["acls", "add", "--principal", "User:x", "--resource-type", "topic", "--name", "t"]
    assert "invalid choice: 'fly'" in run.fails(*acl, "--operation", "fly", *key, code=2)
    err = run.fails("acls", "add", "--principal", "x", "--resource-type", "topic",
                    "--name", "t", "--operation", "read", code=2)  # fmt: skip
    assert "expected User:NAME" in err
    assert "at least one field" in run.fails("acls", "remove", *key, code=2)
    assert "name the entity" in run.fails("quotas", "set", "--producer-byte-rate", "1", code=2)
    assert "at least one quota" in run.fails("quotas", "set", "--user", "x", *key, code=2)
    assert ">= 0" in run.fails("quotas", "set", "--user", "x", "--producer-byte-rate", "-1",
                               code=2)  # fmt: skip
    assert "not allowed with" in run.fails("quotas", "list", "--user", "a", "--user-default",
                                           code=2)  # fmt: skip
    # Refused by the broker: one line, exit 1.
    for argv in (
        ["users", "create", "bad name!"],
        ["keys", "revoke", "admin", "not-hex"],
        ["acls", "add", "--principal", "User:x", "--resource-type", "cluster", "--name", "c",
         "--operation", "alter"],
        ["keys", "create", "nobody-here"],
    ):  # fmt: skip
        err = run.fails(*argv, *key)
        assert err.count("\n") == 1 and re.search(r": [A-Z_]+ \(4\d\d\): ", err), err
    assert "users" in cli.build_parser().format_help()
    for command in ("users", "keys", "acls", "quotas", "whoami"):
        assert re.search(rf"^\s+{command}\s", cli.build_parser().format_help(), re.M), command


def test_produce_and_consume_with_a_key_from_the_environment(
    run: Run, broker: BrokerProcess
) -> None:
    run.admin("topics", "create", "env-orders", "--partitions", "2")
    # A cluster-style --url whose second broker is gone: the key goes to whichever answers.
    url = f"{broker.url},http://127.0.0.1:{free_port()}"
    env = {"LOGBUS_URL": url, "LOGBUS_API_KEY": ADMIN_KEY}
    code, _, err = _subprocess("produce", "env-orders", env=env, stdin="1\n2\n3\n")
    assert code == 0 and "produced 3 record(s)" in err, err
    code, out, err = _subprocess("consume", "env-orders", "--format", "json", env=env)
    assert code == 0, err
    assert sorted(json.loads(line)["value"] for line in out.splitlines()) == ["1", "2", "3"]
    code, _, err = _subprocess("consume", "env-orders", env={"LOGBUS_URL": url})
    assert code == 1 and "(401)" in err and "no API key given" in err, err
