"""Checks of our own for the conformance run, beside schemathesis' built-in
ones: every error answer carries the spec's code of its HTTP status, and a
request that breaks the schema is refused with 400 INVALID_ARGUMENT."""

import itertools

import schemathesis
from schemathesis import CheckContext
from schemathesis.core.failures import Failure
from schemathesis.generation.meta import TestPhase
from schemathesis.generation.modes import GenerationMode

# The one mapping of error codes to HTTP statuses (bcm_core::ErrorCode).
CODES = {
    400: {"INVALID_ARGUMENT"},
    401: {"UNAUTHENTICATED"},
    403: {"FORBIDDEN"},
    404: {"NOT_FOUND"},
    409: {"INVALID_STATE", "CONFLICT", "UNVERIFIED_WIPE"},
    422: {"INVALID_CONFIG"},
    500: {"INTERNAL"},
    503: {"UNAVAILABLE"},
}


class WrongErrorCode(Failure):
    def __init__(self, *, operation: str, status: int, code, expected):
        super().__init__(
            operation=operation,
            code="wrong_error_code",
            title="Error code does not match the HTTP status",
            message=f"HTTP {status} carried code {code!r}; expected one of {sorted(expected)}",
        )


@schemathesis.check
def error_body_names_its_code(ctx: CheckContext, response, case) -> None:
    """An error answer's body is {code, message} with the code of its status."""
    status = response.status_code
    if status < 400 or status == 405:
        return None
    expected = CODES.get(status)
    if expected is None:
        raise WrongErrorCode(operation=case.operation.label, status=status, code=None, expected=set())
    try:
        body = response.json()
    except Exception:
        body = None
    code = body.get("code") if isinstance(body, dict) else None
    if code not in expected:
        raise WrongErrorCode(operation=case.operation.label, status=status, code=code, expected=expected)
    return None


# The stateful phase follows the document's links from an enroll to the
# verbs on the node it returns. A random tenant and pool would make every
# enroll a 404 and every sequence end there, so a schema-valid enroll of
# that phase is pointed at the seeded tenant and pool with a simulated BMC
# (still schema-valid: only valid values are swapped for other valid ones),
# and a deploy at the seeded profile. The other phases stay random.
_machines = itertools.count(1)


# A command poll waits up to waitMs for a command that never comes here;
# its waiting is the Rust tests' subject, not this run's. A schema-valid
# poll waits at most 200 ms, so the run does not sit out 30 s polls.
MAX_POLL_MS = 200


@schemathesis.hook
def before_call(ctx, case, **kwargs):
    meta = case.meta
    if meta is None:
        return
    positive = meta.generation.mode == GenerationMode.POSITIVE
    if positive and case.operation.label == "GET /api/agent/commands" and isinstance(case.query, dict):
        wait = case.query.get("waitMs")
        if isinstance(wait, int) and not isinstance(wait, bool) and wait > MAX_POLL_MS:
            case.query["waitMs"] = MAX_POLL_MS
        return
    if meta.phase.name != TestPhase.STATEFUL:
        return
    if meta.generation.mode != GenerationMode.POSITIVE or not isinstance(case.body, dict):
        return
    label = case.operation.label
    if label == "POST /api/compute/metal/enroll":
        case.body["tenantId"] = "root"
        case.body["poolId"] = "default"
        case.body.pop("hardwareProfile", None)
        case.body.pop("macs", None)
        case.body["bmc"] = {
            "driver": "sim",
            "address": f"sim://conformance-{next(_machines)}",
            "username": "admin",
            "password": "conformance",
        }
    elif label == "POST /api/compute/metal/deploy":
        case.body["profileId"] = "ubuntu-24.04"
        case.body["profileVersion"] = 1
