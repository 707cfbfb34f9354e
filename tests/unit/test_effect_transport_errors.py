"""How every effect client reads its connection's troubles, and the waybill number's checks:
one helper each (``app.adapters.effects``), so that a provider module cannot read them differently."""

from __future__ import annotations

import aiohttp
import pytest

from app.adapters.effects import WAYBILL_NO_MAX, call_timeout, transport_errors, waybill_number
from app.pipeline.errors import (
    EffectBadReceipt,
    EffectNotDelivered,
    EffectRejected,
    EffectUnavailable,
    UnknownOutcomeNonIdempotent,
)

TIMEOUT = call_timeout(3.0, 0.5)


def raised(exc: BaseException, **kw):
    with pytest.raises(Exception) as caught, transport_errors("sms for ORD-1", TIMEOUT, **kw):
        raise exc
    return caught.value


def test_no_connection_is_not_sent_even_when_it_is_a_timeout_too():
    error = raised(aiohttp.ConnectionTimeoutError(), in_doubt=UnknownOutcomeNonIdempotent)
    assert isinstance(error, EffectNotDelivered) and "no connection within 0.5s; not sent" in str(error)


def test_an_answer_that_never_came_is_in_doubt_as_the_client_says():
    assert isinstance(raised(TimeoutError()), EffectUnavailable)
    error = raised(TimeoutError(), in_doubt=UnknownOutcomeNonIdempotent)
    assert isinstance(error, UnknownOutcomeNonIdempotent) and "no answer within 3s" in str(error)
    lost = raised(aiohttp.ServerDisconnectedError(), in_doubt=UnknownOutcomeNonIdempotent)
    assert isinstance(lost, UnknownOutcomeNonIdempotent) and "ServerDisconnectedError" in str(lost)


def test_the_calls_own_error_goes_through_unchanged():
    own = EffectRejected("sms for ORD-1: refused")
    assert raised(own, in_doubt=UnknownOutcomeNonIdempotent) is own


@pytest.mark.parametrize("value, error", [(None, EffectUnavailable), ("", EffectUnavailable),
                                          (12345, EffectBadReceipt), ("W" * (WAYBILL_NO_MAX + 1), EffectBadReceipt)])
def test_a_waybill_number_that_does_not_fit_the_receipt_is_refused(value, error):
    with pytest.raises(error):
        waybill_number("waybill for ORD-1", "code 0", value)
    assert waybill_number("waybill for ORD-1", "200", "W" * WAYBILL_NO_MAX) == "W" * WAYBILL_NO_MAX
