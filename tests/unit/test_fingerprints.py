"""Fingerprints: the dead letters of one cause share one, whatever their ids and timings;
another reason, effect or status is another group."""

from app.compensation.fingerprints import fingerprint, shape


def test_letters_of_one_outage_that_differ_only_in_ids_and_times_have_one_fingerprint():
    outage = [
        ("effect_unavailable", "logistics for ORD-20261201-AB12: answered 503"),
        ("effect_unavailable", "logistics for ORD-20261130-ZZZ999: answered 503"),
        ("effect_unavailable", "gave up after 5 redrives: effect_unavailable: logistics for ORD-20261201-Q1: answered 503"),
        ("effect_unavailable", "effect_unavailable: logistics for ORD-20261201-Q2: answered 503"),       # a redrive's
        ("effect_unavailable", "not retriable: effect_unavailable: logistics for ORD-20261201-Q3: answered 503"),
    ]
    assert len({fingerprint(*letter) for letter in outage}) == 1
    refused = [("effect_rejected", f"logistics for ORD-20261201-{n}: refused with 422: b'{{\"error\": \"order "
                                   f"ORD-20261201-{n} rejected\"}}'") for n in ("A1", "B22", "C333")]
    assert len({fingerprint(*letter) for letter in refused}) == 1
    connect = [("effect_unavailable", f"logistics for ORD-20261201-X{i}: ClientConnectorError: Cannot connect to "
                                      f"host 10.0.{i}.7:{8000 + i} ssl:default [Connect call failed ('10.0.{i}.7', "
                                      f"{8000 + i})]") for i in range(3)]
    assert len({fingerprint(*letter) for letter in connect}) == 1
    slow = [("effect_outcome_unknown", f"SMS for ORD-20261201-{n}: no answer within {s}s; it may have been sent")
            for n, s in (("A", "2.5"), ("B", "10"))]
    assert len({fingerprint(*letter) for letter in slow}) == 1
    ids = [("malformed", f"event {e} of order ORD-20261201-{o} at offset {off}: field {h} has no value")
           for e, o, off, h in (("3f2a9c1e-1111-2222-3333-444455556666", "A", 12, "0xdeadbeef"),
                                ("0b7c1d2e-aaaa-bbbb-cccc-0123456789ab", "B", 99381, "0x1f2e3d"))]
    assert len({fingerprint(*letter) for letter in ids}) == 1


def test_another_status_effect_reason_or_error_class_is_another_group():
    base = fingerprint("effect_unavailable", "logistics for ORD-20261201-AB12: answered 503")
    assert fingerprint("effect_unavailable", "logistics for ORD-20261201-AB12: answered 502") != base
    assert fingerprint("effect_unavailable", "SMS for ORD-20261201-AB12: answered 503") != base
    assert fingerprint("deadline_exceeded", "logistics for ORD-20261201-AB12: answered 503") != base
    assert fingerprint("effect_unavailable", "logistics for ORD-20261201-AB12: ServerDisconnectedError: x") != \
        fingerprint("effect_unavailable", "logistics for ORD-20261201-AB12: ClientOSError: x")


def test_the_shape_names_the_effect_and_the_status_or_the_error_class():
    got = shape("effect_unavailable", "logistics for ORD-20261201-AB12: answered 503")
    assert (got.effect, got.detail, got.message) == ("logistics", "503", "logistics for <order>: answered <n>")
    got = shape("effect_unavailable", "logistics for ORD-1: ClientConnectorError: Cannot connect to host a:80")
    assert (got.effect, got.detail) == ("logistics", "ClientConnectorError")
    got = shape("malformed", None)
    assert (got.effect, got.detail, got.message) == ("-", "-", "")
    assert len(fingerprint("malformed", None)) == 16 and int(fingerprint("malformed", None), 16) >= 0
