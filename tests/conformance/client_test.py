"""A client generated from proto/openapi.json (openapi-python-client), used
the way a platform team would: read nodes, enroll a machine of the
simulated site, wait for it to be ready, deploy it, read it deployed.
Every call goes through the generated models, so a field, an enum value or
an optional field that differs between the document and the wire fails
here."""

import os
import sys
import time

from bcm_client import AuthenticatedClient
from bcm_client.api.metal import deploy, enroll, get_node, list_nodes, provide, undeploy
from bcm_client.models import (
    ApiErrorBody,
    DeployRequest,
    ErrorCode,
    NodeRequest,
    UndeployRequest,
    WipeMode,
    EnrollBmc,
    EnrollDriver,
    EnrollRequest,
    NodeView,
    ProvisionState,
)

base = os.environ["BCM_URL"]
token = os.environ["BCM_TOKEN"]
# HTTPS: the generated client trusts the local CA alone.
client = AuthenticatedClient(
    base_url=base,
    token=token,
    raise_on_unexpected_status=True,
    verify_ssl=os.environ["BCM_CA_FILE"],
)


def wait_for(node_id: str, state: ProvisionState, within: float = 120.0) -> NodeView:
    deadline = time.monotonic() + within
    while True:
        node = get_node.sync(client=client, node_id=node_id)
        assert isinstance(node, NodeView), node
        if node.provision_state == state:
            return node
        assert node.provision_state != ProvisionState.FAILED, f"{node_id} failed: {node.last_error}"
        assert time.monotonic() < deadline, f"{node_id} is {node.provision_state}, not {state}"
        time.sleep(0.2)


page = list_nodes.sync(client=client, tenant_id="root")
print(f"client: listed {len(page.items)} nodes of tenant root, each decoded as NodeView")
for node in page.items:
    assert isinstance(node.provision_state, ProvisionState)

enrolled = enroll.sync(
    client=client,
    body=EnrollRequest(
        tenant_id="root",
        pool_id="default",
        bmc=EnrollBmc(
            driver=EnrollDriver.SIM,
            address=f"sim://client-{os.getpid()}",
            username="admin",
            password="client-test-password",
        ),
    ),
)
assert isinstance(enrolled, NodeView), enrolled
print(f"client: enrolled {enrolled.node_id} ({enrolled.provision_state.value})")
ready = wait_for(enrolled.node_id, ProvisionState.READY)
print(f"client: {ready.node_id} is ready, power {ready.power.value}, macs {ready.macs}")
started = deploy.sync(
    client=client,
    body=DeployRequest(
        tenant_id="root", node_id=ready.node_id, profile_id="ubuntu-24.04", profile_version=1
    ),
)
assert isinstance(started, NodeView) and started.provision_state == ProvisionState.DEPLOYING, started
deployed = wait_for(ready.node_id, ProvisionState.DEPLOYED)
print(f"client: {deployed.node_id} is deployed")

# A refused verb decodes as the documented error body with its code.
refused = provide.sync(client=client, body=NodeRequest(tenant_id="root", node_id=deployed.node_id))
assert isinstance(refused, ApiErrorBody) and refused.code == ErrorCode.INVALID_STATE, refused
print(f"client: provide on a deployed node is {refused.code.value}: {refused.message}")

released = undeploy.sync(
    client=client,
    body=UndeployRequest(tenant_id="root", node_id=deployed.node_id, wipe=WipeMode.QUICK),
)
assert isinstance(released, NodeView) and released.provision_state == ProvisionState.RELEASING, released
wait_for(deployed.node_id, ProvisionState.READY)
print(f"client: {deployed.node_id} is released, wiped and ready again")
sys.exit(0)
