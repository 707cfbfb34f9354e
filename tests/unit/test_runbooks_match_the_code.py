"""The runbooks name only what the product has: every reason is one the code can write, every command
exists with the options shown, every console link is a page the console routes to, every web view is a
route of the worker, every metric and setting exists. A runbook is read at 3 a.m. and followed as it is:
a reason nobody writes filters an empty queue, an option the command refuses ends the step.

And the two things an outage's runbooks must say: its dead letters carry two reasons
(``provider_unavailable`` while the provider's breaker is open, ``effect_unavailable`` for the calls that
failed before it opened or around its probes), so every bulk retry shown filters both; and the SLA
runbook says when to start a bulk job and how to split one above ``BULK_MAX_ROWS``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from app.pipeline.errors import EffectUnavailable, ProviderUnavailable
from app.pipeline.events import EventType
from app.pipeline.lookalikes import resembled
from app.pipeline.reasons import VOCABULARY
from app.reconcile.input import End
from harness import surface
from harness.surface import code_of, commands_in, refusal

ROOT = Path(__file__).resolve().parents[2]
RUNBOOKS = sorted((ROOT / "docs" / "runbooks").glob("*.md"))
# Reasons the compensator writes on a ledger row it opened for a dead letter it could not read
# (app/compensation/dead_letters.py), and the outcomes a person's decision gives pending steps.
LEDGER_REASONS = {"unreadable_dead_letter": "app/compensation/dead_letters.py",
                  "no_ledger_row": "app/compensation/dead_letters.py",
                  "unstorable_dead_letter": "app/compensation/dead_letters.py",
                  "resolved_by_person": "app/pipeline/model.py", "discarded_by_person": "app/pipeline/model.py"}
# Other lower-case names a runbook may say, and the file that must hold each.
NAMED_ELSEWHERE = {"lock_timeout": "app/timers/partitions.py", "p_future": "app/adapters/mysql/partitions.py",
                   "event_id": "app/pipeline/events.py", "site_url": "mkdocs.yml",
                   "runbook_url": "deploy/prometheus/rules.yml", "partition-maintenance": "app/timers/partitions.py"}
# Upper-case names that are not settings of ours: MariaDB's and Prometheus's.
NOT_SETTINGS = {"AFTER_SYNC": "semi-synchronous replication's wait point", "ALTER": "a privilege",
                "ERROR": "a log level"}
OWN_TYPES = tuple((t.value, t.value) for t in EventType)
SNAKE = re.compile(r"[a-z][a-z0-9]*(?:_[a-z0-9]+)+")
UPPER = re.compile(r"[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+")
METRIC = re.compile(r"(order_[a-z_]+)(\{[^}]*\})?")
WEB_PATH = re.compile(r"(?:(GET|POST) )?(/[a-z][a-z_/-]*(?:\{[a-z_]+\}|<[^>]+>|[A-Za-z0-9_.-]*)[a-z_/{}<>-]*)(\?\S*)?")


def runbook_code() -> list[tuple[str, str]]:
    return [(page.name, span) for page in RUNBOOKS for span in code_of(page.read_text())]


def reasons_the_code_writes() -> set[str]:
    for reason, where in LEDGER_REASONS.items():
        assert f'"{reason}"' in (ROOT / where).read_text() or reason.upper() in (ROOT / where).read_text(), reason
    return set(VOCABULARY) | set(LEDGER_REASONS)


def test_the_outage_reasons_are_the_errors_the_pipeline_raises():
    assert ProviderUnavailable.reason == "provider_unavailable" and ProviderUnavailable.retriable
    assert EffectUnavailable.reason == "effect_unavailable" and EffectUnavailable.retriable
    assert {"provider_unavailable", "effect_unavailable"} <= VOCABULARY


def test_every_lower_case_name_a_runbook_says_is_one_the_code_has():
    reasons = reasons_the_code_writes()
    ends = {end.value for end in End}
    for name, where in NAMED_ELSEWHERE.items():
        assert name in (ROOT / where).read_text(), f"{name} is no longer in {where}"
    unknown = []
    for page, span in runbook_code():
        if not SNAKE.fullmatch(span) or span.startswith("order_") or span.startswith("t_"):
            continue
        if span in reasons or span in ends or span in NAMED_ELSEWHERE or resembled(span, OWN_TYPES):
            continue
        unknown.append(f"{page}: `{span}`")
    assert unknown == [], f"runbooks name reasons or values the code does not have: {unknown}"


def test_every_metric_a_runbook_names_is_exported():
    names = surface.metric_names()
    unknown = [f"{page}: `{span}`" for page, span in runbook_code() for metric in [METRIC.fullmatch(span)]
               if metric and metric.group(1) not in names and not resembled(span, OWN_TYPES)]
    assert unknown == [], f"runbooks name metrics app/observability/metrics.py does not define: {unknown}"


def test_every_setting_a_runbook_names_exists():
    names = surface.setting_names()
    unknown = []
    for page, span in runbook_code():
        name = span.split("=", 1)[0]
        if not UPPER.fullmatch(name) or name in names or name in NOT_SETTINGS or resembled(name, OWN_TYPES):
            continue
        unknown.append(f"{page}: `{span}`")
    assert unknown == [], f"runbooks name settings the configuration does not have: {unknown}"


def test_every_command_a_runbook_shows_exists_with_its_options():
    shown = commands_in(runbook_code())
    refused = [f"{page}: `{span}`: {why}" for page, span, words in shown for why in [refusal(words)] if why]
    assert refused == [], "runbooks show commands the product refuses:\n" + "\n".join(refused)
    assert len(shown) > 10, "the runbooks' commands are no longer found: this test would pass on anything"


@pytest.mark.parametrize(("words", "why"), [
    (["faust -A app", "recovery", "start", "--reason", "x"], "no option"),
    (["faust -A app", "dlq", "bulk", "retry", "--reason", "effect_unavailable"], None),
    (["faust -A app", "dlq", "bulk", "rerun"], "dlq bulk takes"),
    (["faust -A app", "replay"], "no command"),
    (["python -m", "app.admin", "migrate", "--sql"], None),
    (["python -m", "app.admin", "drop-topics"], "no command"),
    (["python -m", "bench.broker_bounce"], None),
])
def test_a_refused_command_is_told_apart(words, why):
    said = refusal(words)
    assert (said is None) if why is None else (why in said), said


def console_links(text: str) -> list[str]:
    return re.findall(r"/console/[^\s`)\"']*", text)


def console_refusal(link: str) -> str | None:
    pages, filters = surface.console_pages(), surface.console_queue_filters()
    rest = link.removeprefix("/console/")
    if rest in ("", "console.js"):
        return None
    if not rest.startswith("#/"):
        return "the console routes by its fragment: /console/#/<page>"
    path, _, query = rest[2:].partition("?")
    page = path.split("/")[0]
    if page not in pages:
        return f"the console has no page {page!r}: {pages}"
    keys = {pair.split("=")[0] for pair in query.split("&") if pair}
    if keys and page != "queue":
        return "only the queue takes a filter"
    return f"the queue filters by {sorted(filters)}, not {sorted(keys - filters)}" if keys - filters else None


def test_every_console_link_of_a_runbook_is_a_page_the_console_routes_to():
    links = [(page.name, link) for page in RUNBOOKS for link in console_links(page.read_text())]
    refused = [f"{page}: {link}: {why}" for page, link in links for why in [console_refusal(link)] if why]
    assert refused == [], refused
    assert len(links) >= 4
    assert console_refusal("/console/?status=manual") and console_refusal("/console/#/queues")
    assert console_refusal("/console/#/queue?state=manual") and not console_refusal("/console/#/queue?status=manual")


def route_of(path: str, routes: set[str]) -> str | None:
    """The route that answers ``path`` (placeholders such as ``<id>`` or ``{id}`` match any segment)."""
    if path in routes:
        return path
    parts = path.split("/")
    for route in routes:
        pattern = route.split("/")
        if len(pattern) == len(parts) and all(p == q or (q and (p.startswith("{") or q.startswith(("<", "{"))))
                                               for p, q in zip(pattern, parts, strict=True)):
            return route
    return None


def documented_parameters() -> dict[str, set[str]]:
    doc = yaml.safe_load((ROOT / "docs" / "openapi.yaml").read_text())
    found: dict[str, set[str]] = {}
    for path, item in doc["paths"].items():
        for op in item.values():
            if isinstance(op, dict):
                params = [doc["components"]["parameters"][p["$ref"].rsplit("/", 1)[1]] if "$ref" in p else p
                          for p in op.get("parameters", [])]
                found.setdefault(path, set()).update(p["name"] for p in params if p["in"] == "query")
    return found


def test_every_web_view_a_runbook_names_is_a_route_with_those_parameters():
    routes = {path for _, path in surface.web_routes()}
    parameters = documented_parameters()
    named, refused = 0, []
    for page, span in runbook_code():
        for method, path, query in WEB_PATH.findall(re.sub(r"/console/\S*|\S+://\S+", "", span)):
            if path.startswith("/console/") or not (method or path.endswith("/") or query):
                continue
            named += 1
            route = route_of(path, routes)
            if route is None:
                refused.append(f"{page}: {path}: no such route")
                continue
            keys = {pair.split("=")[0] for pair in query.lstrip("?").split("&") if pair}
            if keys - parameters.get(route, set()):
                refused.append(f"{page}: {path}{query}: {route} takes {sorted(parameters.get(route, ()))}")
    assert named >= 8 and refused == [], refused


def bulk_retries(text: str) -> list[str]:
    """Each block or paragraph of ``text`` that shows a bulk retry filtered by a reason."""
    blocks = re.split(r"\n\s*\n|^[ \t]*```", text, flags=re.MULTILINE)
    return [b for b in blocks if re.search(r"bulk retry[^\n]*--reason|\"action\": \"retry\"[^\n]*\"reason\"", b)]


def test_every_bulk_retry_of_an_outage_filters_both_of_its_reasons():
    pages = [*sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "app" / "commands").glob("*.py"))]
    shown = [(page, block) for page in pages for block in bulk_retries(page.read_text())]
    assert len(shown) >= 3, "no bulk retry by reason found in the docs: this test would pass on anything"
    half = [str(page.relative_to(ROOT)) for page, block in shown
            if "effect_unavailable" in block and "provider_unavailable" not in block]
    assert half == [], (f"{half}: a provider's outage leaves provider_unavailable letters while its breaker is open "
                        "and effect_unavailable around it: a retry of one leaves the other in the queue")


def test_the_sla_runbook_says_when_to_start_a_bulk_job_and_how_to_split_a_large_one():
    page = (ROOT / "docs" / "runbooks" / "CompensationSlaBreached.md").read_text()
    assert "provider_unavailable" in page and "effect_unavailable" in page
    assert "BULK_MAX_ROWS" in page and "--dry-run" in page
    splits = [words for _, _, words in commands_in([("", s) for s in code_of(page)])
              if "bulk" in words and ("--since" in words or "--until" in words)]
    assert len(splits) >= 2, "show the split: one job per time slice (--since/--until) under BULK_MAX_ROWS"
    assert re.search(r"when .*(provider|cause).* (back|fixed)", page, re.IGNORECASE | re.DOTALL)


def test_the_troubleshooting_page_leads_to_every_runbook():
    page = (ROOT / "docs" / "troubleshooting.md").read_text()
    rules = yaml.safe_load((ROOT / "deploy" / "prometheus" / "rules.yml").read_text())
    alerts = [rule["alert"] for group in rules["groups"] for rule in group["rules"] if "alert" in rule]
    missing = [a for a in alerts if f"alert `{a}`" not in page or f"(runbooks/{a}.md)" not in page]
    assert alerts and missing == [], f"docs/troubleshooting.md does not lead from these alerts to their runbooks: {missing}"
