"""sushy-tools' Redfish emulator with an AccountService added.

sushy-tools (2.2.0) has no AccountService, so a password rotation could not
be exercised against it. This wrapper registers the three resources a
rotation uses on the emulator's own Flask app, backed by the same htpasswd
file its basic-auth middleware reads on every request (so a changed password
is the one the emulator checks from the next request on), and then runs the
emulator's own main() with the same arguments:

  GET   /redfish/v1/AccountService
  GET   /redfish/v1/AccountService/Accounts
  GET   /redfish/v1/AccountService/Accounts/<name>   (with @odata.etag)
  PATCH /redfish/v1/AccountService/Accounts/<name>   {"Password": ...}
        honours If-Match (412 on a stale ETag); other properties are 400.

The service root gains the `AccountService` link, and every request that
changes something (PATCH, POST, PUT, DELETE) is logged to stderr as one
line, `sushy-request: <METHOD> <path> <JSON body>` (a `Password` shown as
"***"): the emulator logs no bodies, and the libvirt driver keeps a one-time
boot override as a boot order change, so this line is where a test sees
what the BMC was asked (`BootSourceOverrideEnabled: Once`, a
`GracefulShutdown`). Everything else is the unchanged emulator. Run:
python sushy_accounts.py --config sushy.conf
"""

import hashlib
import json
import os
import sys
import tempfile

import bcrypt
import flask
from sushy_tools.emulator import main as emulator

app = emulator.app
ROOT = "/redfish/v1/AccountService"


def _auth_file():
    return app.config["SUSHY_EMULATOR_AUTH_FILE"]


def _users():
    with open(_auth_file()) as f:
        return [tuple(line.strip().split(":", 1)) for line in f if ":" in line]


def _etag(hashed):
    return '"%s"' % hashlib.sha256(hashed.encode()).hexdigest()[:16]


def _error(status, message, message_id):
    body = {"error": {"code": "Base.1.0.GeneralError", "message": message,
                      "@Message.ExtendedInfo": [{"MessageId": message_id,
                                                 "Message": message}]}}
    return flask.Response(json.dumps(body), status=status,
                          mimetype="application/json")


def _redacted(value):
    if isinstance(value, dict):
        return {k: ("***" if k == "Password" else _redacted(v))
                for k, v in value.items()}
    if isinstance(value, list):
        return [_redacted(v) for v in value]
    return value


@app.before_request
def _log_writes():
    if flask.request.method in ("PATCH", "POST", "PUT", "DELETE"):
        body = flask.request.get_json(silent=True)
        print("sushy-request: %s %s %s" % (
            flask.request.method, flask.request.path,
            json.dumps(_redacted(body), sort_keys=True)),
            file=sys.stderr, flush=True)


@app.after_request
def _root_links_account_service(response):
    if (flask.request.path.rstrip("/") == "/redfish/v1"
            and response.status_code == 200 and response.is_json):
        body = response.get_json()
        body["AccountService"] = {"@odata.id": ROOT}
        response.set_data(json.dumps(body))
    return response


@app.route(ROOT)
def account_service():
    return flask.jsonify({
        "@odata.type": "#AccountService.v1_5_0.AccountService",
        "@odata.id": ROOT, "Id": "AccountService", "Name": "Account Service",
        "ServiceEnabled": True, "MinPasswordLength": 8,
        "MaxPasswordLength": 32,
        "Accounts": {"@odata.id": ROOT + "/Accounts"}})


@app.route(ROOT + "/Accounts")
def accounts():
    members = [{"@odata.id": "%s/Accounts/%s" % (ROOT, name)}
               for name, _ in _users()]
    return flask.jsonify({
        "@odata.type": "#ManagerAccountCollection.ManagerAccountCollection",
        "@odata.id": ROOT + "/Accounts", "Name": "Accounts",
        "Members@odata.count": len(members), "Members": members})


@app.route(ROOT + "/Accounts/<name>", methods=["GET", "PATCH"])
def account(name):
    users = dict(_users())
    if name not in users:
        return _error(404, "no account %s" % name,
                      "Base.1.0.ResourceMissingAtURI")
    etag = _etag(users[name])
    if flask.request.method == "GET":
        response = flask.jsonify({
            "@odata.type": "#ManagerAccount.v1_7_0.ManagerAccount",
            "@odata.id": "%s/Accounts/%s" % (ROOT, name),
            "@odata.etag": etag, "Id": name, "Name": "User Account",
            "UserName": name, "RoleId": "Administrator", "Enabled": True,
            "Locked": False, "Password": None})
        response.headers["ETag"] = etag
        return response
    if_match = flask.request.headers.get("If-Match")
    if if_match not in (None, "*", etag):
        return _error(412, "the account changed since it was read",
                      "Base.1.0.PreconditionFailed")
    body = flask.request.get_json(silent=True) or {}
    other = sorted(set(body) - {"Password"})
    if other or not isinstance(body.get("Password"), str):
        return _error(400, "only Password may be written here (got %s)"
                      % ", ".join(other or ["no Password"]),
                      "Base.1.0.PropertyNotWritable")
    password = body["Password"]
    if not 8 <= len(password) <= 32:
        return _error(400, "the password must be 8-32 characters",
                      "Base.1.0.PropertyValueFormatError")
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt()).decode()
    lines = ["%s:%s" % (n, hashed if n == name else h)
             for n, h in _users()]
    directory = os.path.dirname(os.path.abspath(_auth_file()))
    with tempfile.NamedTemporaryFile("w", dir=directory, delete=False) as f:
        f.write("\n".join(lines) + "\n")
    os.replace(f.name, _auth_file())
    return flask.Response(status=204)


if __name__ == "__main__":
    sys.exit(emulator.main())
