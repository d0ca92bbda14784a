//! BMC credentials never leave sealed form: no response body of any method
//! contains them, no event does, and a `pg_dump` of the database does not.

use bcm_core::{NodeId, ProvisionState};
use bcm_testkit::TestEnv;
use serde_json::json;
use std::time::Duration;

const USERNAME: &str = "bmc-operator-7f3a91";
const PASSWORD: &str = "pw-Zq8!v2-unguessable-91c4";

#[tokio::test]
async fn credentials_appear_in_no_response_event_or_dump() {
    let env = TestEnv::start().await.expect("env");
    let reader = env
        .events_consumer("sec", &env.subjects().events_all())
        .await
        .expect("consumer");
    let admin = env.admin_token.clone();
    let mut bodies = vec![];
    let (s, enrolled) = env
        .post("/api/compute/metal/enroll", Some(&admin), &json!({"tenantId": "a", "poolId": "a-pool",
            "bmc": {"driver": "redfish", "address": "https://10.9.9.9", "username": USERNAME, "password": PASSWORD}}))
        .await
        .expect("enroll");
    assert_eq!(s, 200);
    assert_eq!(
        enrolled["bmc"],
        json!({"driver": "redfish", "address": "https://10.9.9.9", "credentialsSet": true})
    );
    bodies.push(enrolled.to_string());
    let id: NodeId = enrolled["nodeId"]
        .as_str()
        .expect("id")
        .parse()
        .expect("id");
    let nid = id.to_string();

    // Every method, from a state where it is legal.
    let plan: [(ProvisionState, &str, serde_json::Value); 12] = [
        (ProvisionState::Ready, "manage", json!({})),
        (ProvisionState::Ready, "inspect", json!({})),
        (ProvisionState::Ready, "provide", json!({})),
        (
            ProvisionState::Ready,
            "deploy",
            json!({"profileId": "p", "profileVersion": 1}),
        ),
        (
            ProvisionState::Deployed,
            "undeploy",
            json!({"wipe": "crypto-erase"}),
        ),
        (ProvisionState::Deployed, "rescue", json!({})),
        (ProvisionState::Rescue, "unrescue", json!({})),
        (
            ProvisionState::Enrolling,
            "abort",
            json!({"reason": "test"}),
        ),
        (ProvisionState::Failed, "recover", json!({})),
        (ProvisionState::Ready, "retire", json!({})),
        (ProvisionState::Ready, "power", json!({"action": "off"})),
        (ProvisionState::Retired, "power", json!({"action": "on"})),
    ];
    for (state, verb, extra) in plan {
        let failed_from = (state == ProvisionState::Failed).then_some(ProvisionState::Inspecting);
        env.force_state(&id, state, failed_from)
            .await
            .expect("force");
        let mut body = json!({"tenantId": "a", "nodeId": nid});
        if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
            b.extend(e.clone());
        }
        let (s, answer) = env
            .post(&format!("/api/compute/metal/{verb}"), Some(&admin), &body)
            .await
            .expect("post");
        assert_eq!(s, 200, "{verb} from {state}: {answer}");
        assert_eq!(answer["bmc"]["credentialsSet"], true);
        bodies.push(answer.to_string());
    }
    let (_, one) = env
        .get(&format!("/api/compute/metal/nodes/{nid}"), Some(&admin))
        .await
        .expect("get");
    let (_, list) = env
        .get("/api/compute/metal/nodes", Some(&admin))
        .await
        .expect("list");
    bodies.push(one.to_string());
    bodies.push(list.to_string());
    for b in &bodies {
        assert!(
            !b.contains(PASSWORD) && !b.contains(USERNAME),
            "a response leaked credentials: {b}"
        );
    }

    let events = reader
        .drain(Duration::from_millis(800))
        .await
        .expect("events");
    assert!(events.len() >= 13, "events were published");
    for e in &events {
        let text = serde_json::to_string(&e.event).expect("json");
        assert!(
            !text.contains(PASSWORD) && !text.contains(USERNAME),
            "an event leaked credentials: {text}"
        );
    }

    let dump = std::process::Command::new(bcm_testkit::pg_dump())
        .arg("--dbname")
        .arg(&env.database_url)
        .output()
        .expect("pg_dump runs");
    assert!(
        dump.status.success(),
        "pg_dump: {}",
        String::from_utf8_lossy(&dump.stderr)
    );
    let text = String::from_utf8_lossy(&dump.stdout);
    assert!(text.contains("sealed_secrets"), "the dump holds the schema");
    assert!(
        !text.contains(PASSWORD),
        "the dump holds the plaintext password"
    );
    assert!(
        !text.contains(USERNAME),
        "the dump holds the plaintext username"
    );

    // The sealed value opens only with the key, for this node.
    let node = env.node(&id).await.expect("node");
    let row =
        bcm_db::secrets::secret_fetch(&env.db, node.bmc_secret_id.as_deref().expect("secret"))
            .await
            .expect("row");
    let sealed = bcm_seal::Sealed {
        key_id: row.key_id,
        nonce: row.nonce,
        ciphertext: row.ciphertext,
    };
    let creds = env
        .state
        .inner
        .sealer
        .open_credentials(&sealed, &nid)
        .expect("opens for its node");
    assert_eq!(
        secrecy::ExposeSecret::expose_secret(&creds.password),
        PASSWORD
    );
    assert!(env
        .state
        .inner
        .sealer
        .open_credentials(&sealed, "node_other")
        .is_err());
}
