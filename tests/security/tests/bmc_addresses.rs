//! BMC addresses are canonical before the site's uniqueness check (issue
//! 18, finding 5): one BMC written two ways is one BMC, so the second
//! enroll is `CONFLICT`; an address that carries credentials or that the
//! driver cannot use is refused and stores nothing.

use bcm_testkit::{Options, TestEnv};
use serde_json::json;

async fn enroll(env: &TestEnv, driver: &str, address: &str) -> (u16, serde_json::Value) {
    env.post(
        "/api/compute/metal/enroll",
        Some(&env.admin_token),
        // The built-in profile named after the driver binds that driver.
        &json!({"tenantId": "a", "poolId": "a-pool", "hardwareProfile": driver,
            "bmc": {"driver": driver, "address": address, "username": "admin", "password": "pw"}}),
    )
    .await
    .expect("enroll")
}

#[tokio::test]
async fn one_bmc_spelled_two_ways_is_enrolled_once() {
    let env = TestEnv::start_with(Options {
        engine: false,
        ..Options::default()
    })
    .await
    .expect("env");
    let (status, first) = enroll(&env, "redfish", "HTTPS://BMC-1.Example:443/").await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["bmc"]["address"], "https://bmc-1.example");
    for same in [
        "https://bmc-1.example",
        "https://BMC-1.example/",
        " https://bmc-1.example:443 ",
    ] {
        let (status, body) = enroll(&env, "redfish", same).await;
        assert_eq!(
            (status, body["code"].as_str()),
            (409, Some("CONFLICT")),
            "{same}: {body}"
        );
    }
    let (status, _) = enroll(&env, "ipmi", "10.1.2.3").await;
    assert_eq!(status, 200);
    let (status, body) = enroll(&env, "ipmi", "ipmi://10.1.2.3:623").await;
    assert_eq!(
        (status, body["code"].as_str()),
        (409, Some("CONFLICT")),
        "{body}"
    );

    for bad in [
        "https://admin:pw@bmc-2.example",
        "https://bmc-2.example/?a=1",
        "ftp://bmc-2.example",
        "bmc-2",
    ] {
        let (status, body) = enroll(&env, "redfish", bad).await;
        assert_eq!(
            (status, body["code"].as_str()),
            (422, Some("INVALID_CONFIG")),
            "{bad}: {body}"
        );
    }
    let (status, list) = env
        .get(
            "/api/compute/metal/nodes?tenantId=a",
            Some(&env.admin_token),
        )
        .await
        .expect("list");
    assert_eq!(status, 200);
    assert_eq!(list["items"].as_array().map(Vec::len), Some(2), "{list}");
    env.stop();
}
