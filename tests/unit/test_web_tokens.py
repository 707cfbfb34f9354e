"""Per-person tokens (``WEB_TOKENS_FILE``, ``app.adapters.web_tokens``) and who a request's token says
acts (``app.web.http``): the file's lines, read again when the file changes, a broken file refusing every
per-person token, a new token and its line, and the name an action or an unmasked view is audited under."""

from __future__ import annotations

import pytest
from aiohttp.test_utils import make_mocked_request
from pydantic import SecretStr

from app.adapters.web_tokens import TokensFile, TokensFileError, digest, new_line, parse
from app.settings import Settings
from app.web.http import OPERATOR, VIEWER, Caller, Refused, authorize, caller, note_and_actor, reader

ALICE, VERA = "alice-" + "a" * 40, "vera-" + "v" * 40


def line(name: str, role: str, token: str) -> str:
    return f"{name} {role} {digest(token.encode())}\n"


def test_a_file_holds_a_line_per_token_with_comments_and_blank_lines():
    people = parse("# who role hash\n\n" + line("alice", "operator", ALICE) + "  " + line("vera", "viewer", VERA)
                   + line("alice", "operator", "alice-next-token").upper().replace("ALICE OPERATOR", "alice operator"))
    assert [(p.name, p.role) for p in people] == [("alice", "operator"), ("vera", "viewer"), ("alice", "operator")]
    assert people[2].digest == digest(b"alice-next-token")          # hex in either case


@pytest.mark.parametrize("text, why", [
    ("alice operator\n", "line 1: 2 fields"),
    ("al ice operator " + "0" * 64 + "\n", "line 1: 4 fields"),
    ("al!ce operator " + "0" * 64 + "\n", "line 1: a name is"),
    ("alice admin " + "0" * 64 + "\n", "line 1: the role is operator or viewer"),
    ("# a comment\nalice operator " + ALICE + "\n", "line 2: the third field is the token's SHA-256"),
    (line("alice", "operator", ALICE) + line("bob", "viewer", ALICE), "line 2: the same token hash as line 1"),
])
def test_a_bad_line_is_named_by_its_number_never_by_what_it_holds(text, why):
    with pytest.raises(TokensFileError) as refused:
        parse(text)
    assert why in str(refused.value) and ALICE not in str(refused.value)


def test_the_file_is_read_again_when_it_changes_and_a_broken_one_refuses_every_token(tmp_path):
    path = tmp_path / "tokens"
    path.write_text(line("alice", "operator", ALICE) + line("vera", "viewer", VERA))
    book = TokensFile(str(path))
    assert book.names() == {"alice", "vera"}
    path.write_text(line("alice", "operator", ALICE))                  # vera has left
    assert book.names() == {"alice"}
    path.write_text("alice operator not-a-hash\n")
    with pytest.raises(TokensFileError, match="line 1"):
        book.people()
    path.unlink()
    with pytest.raises(TokensFileError, match="No such file"):
        book.people()
    path.write_text(line("alice", "operator", ALICE))
    assert book.names() == {"alice"}


def test_a_new_token_is_long_random_and_its_line_holds_only_its_hash():
    token, made = new_line("alice", "operator")
    again, _ = new_line("alice", "operator")
    assert len(token) >= 43 and token != again and token not in made
    [person] = parse(made)
    assert (person.name, person.role, person.digest) == ("alice", "operator", digest(token.encode()))
    with pytest.raises(ValueError):
        new_line("alice", "admin")


@pytest.fixture
def settings(tmp_path):
    path = tmp_path / "tokens"
    path.write_text(line("alice", "operator", ALICE) + line("vera", "viewer", VERA))
    s = Settings()
    return s.model_copy(update={"web": s.web.model_copy(update={"tokens_file": str(path)})}), path


def request(method: str, token: str | None, actor: str | None = None):
    headers = {"Host": "127.0.0.1"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    if actor is not None:
        headers["X-Actor"] = actor
    return make_mocked_request(method, "/whoami", headers=headers)


def test_a_persons_token_names_them_in_its_role(settings):
    s, _ = settings
    assert caller(request("GET", ALICE), s) == Caller(OPERATOR, "alice")
    assert caller(request("GET", VERA), s) == Caller(VIEWER, "vera")
    assert authorize(request("POST", ALICE), s) == Caller(OPERATOR, "alice")
    with pytest.raises(Refused) as refused:
        authorize(request("POST", VERA), s)                     # a viewer's own token acts on nothing
    assert refused.value.status == 401
    with pytest.raises(Refused) as refused:
        caller(request("GET", "someone-else"), s)
    assert refused.value.status == 401


def test_a_broken_file_refuses_the_persons_tokens_and_says_so_without_the_reason(settings):
    s, path = settings
    path.write_text("alice operator " + ALICE + "\n")
    with pytest.raises(Refused) as refused:
        caller(request("GET", ALICE), s)
    assert refused.value.status == 503 and ALICE not in refused.value.reason and str(path) not in refused.value.reason


def test_the_actor_is_the_tokens_person_and_what_the_body_said_is_kept_in_the_note(settings):
    s, _ = settings
    alice = Caller(OPERATOR, "alice")
    assert note_and_actor({"note": "checked", "actor": "mallory"}, alice, s) == (
        "checked [the request named the actor mallory; the token is alice's]", "web:alice")
    assert note_and_actor({"actor": "alice"}, alice, s) == (None, "web:alice")
    assert note_and_actor({}, alice, s) == (None, "web:alice")
    long, _ = note_and_actor({"note": "x" * 1024, "actor": "mallory"}, alice, s)
    assert long is not None and len(long) <= 1024 and long.endswith("the token is alice's]")


def test_a_shared_token_acts_under_the_name_given_but_never_a_persons(settings):
    s, _ = settings
    shared = Caller(OPERATOR)
    assert note_and_actor({"actor": "ops"}, shared, s) == (None, "web:ops")
    assert note_and_actor({}, shared, s) == (None, "web:anonymous")
    with pytest.raises(Refused) as refused:
        note_and_actor({"actor": "alice"}, shared, s)
    assert refused.value.status == 403 and "token of their own" in refused.value.reason


def test_an_unmasked_view_is_audited_under_the_tokens_person_whatever_x_actor_says(settings):
    s, _ = settings
    shared = s.model_copy(update={"web": s.web.model_copy(update={"token": SecretStr("shared-token-" + "s" * 30)})})
    assert reader(request("GET", ALICE, actor="mallory"), s) == (OPERATOR, "alice")
    assert reader(request("GET", "shared-token-" + "s" * 30, actor="ops"), shared) == (OPERATOR, "ops")
    with pytest.raises(Refused) as refused:
        reader(request("GET", "shared-token-" + "s" * 30, actor="vera"), shared)
    assert refused.value.status == 403
