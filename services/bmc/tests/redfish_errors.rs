//! A Redfish BMC that answers an error or an unexpected shape gets an error
//! that names the resource and what the driver expected (issue 26): a
//! missing `Systems` collection reads differently from a wrong address. A
//! real HTTP server on loopback plays each BMC; each case changes one
//! resource of an otherwise good tree.

use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Router;
use bcm_bmc::driver::{Driver, DriverSettings};
use bcm_bmc::error::BmcError;
use bcm_core::BmcDriver;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::Arc;

/// A good tree: one system, one EthernetInterface, one drive.
fn tree() -> HashMap<String, (StatusCode, String)> {
    let ok = |v: Value| (StatusCode::OK, v.to_string());
    HashMap::from([
        (
            "/redfish/v1".to_owned(),
            ok(json!({"RedfishVersion": "1.6.0", "Systems": {"@odata.id": "/redfish/v1/Systems"}})),
        ),
        (
            "/redfish/v1/Systems".to_owned(),
            ok(json!({"Members": [{"@odata.id": "/redfish/v1/Systems/1"}]})),
        ),
        (
            "/redfish/v1/Systems/1".to_owned(),
            ok(json!({
                "@odata.id": "/redfish/v1/Systems/1", "Id": "1", "PowerState": "Off",
                "EthernetInterfaces": {"@odata.id": "/redfish/v1/Systems/1/EthernetInterfaces"},
                "NetworkInterfaces": {"@odata.id": "/redfish/v1/Systems/1/NetworkInterfaces"},
                "Storage": {"@odata.id": "/redfish/v1/Systems/1/Storage"},
                "Boot": {"BootSourceOverrideTarget": "None",
                         "BootSourceOverrideTarget@Redfish.AllowableValues": ["Pxe", "Hdd"],
                         "BootSourceOverrideMode@Redfish.AllowableValues": ["UEFI"]}
            })),
        ),
        (
            "/redfish/v1/Systems/1/EthernetInterfaces".to_owned(),
            ok(json!({"Members": [{"@odata.id": "/redfish/v1/Systems/1/EthernetInterfaces/1"}]})),
        ),
        (
            "/redfish/v1/Systems/1/EthernetInterfaces/1".to_owned(),
            ok(json!({"MACAddress": "AA:BB:CC:00:00:01"})),
        ),
        (
            "/redfish/v1/Systems/1/NetworkInterfaces".to_owned(),
            ok(json!({"Members": [{"@odata.id": "/redfish/v1/Systems/1/NetworkInterfaces/1"}]})),
        ),
        (
            "/redfish/v1/Systems/1/NetworkInterfaces/1".to_owned(),
            ok(
                json!({"Links": {"NetworkAdapter": {"@odata.id": "/redfish/v1/Chassis/1/NetworkAdapters/gone"}}}),
            ),
        ),
        (
            "/redfish/v1/Systems/1/Storage".to_owned(),
            ok(json!({"Members": []})),
        ),
    ])
}

async fn serve(tree: HashMap<String, (StatusCode, String)>) -> String {
    let tree = Arc::new(tree);
    let router = Router::new().fallback(move |uri: Uri| {
        let tree = tree.clone();
        async move {
            let path = uri.path().trim_end_matches('/');
            let resp: Response = match tree.get(path) {
                Some((status, body)) => (
                    *status,
                    [("Content-Type", "application/json")],
                    body.clone(),
                )
                    .into_response(),
                None => (
                    StatusCode::NOT_FOUND,
                    r#"{"error":{"message":"no such resource"}}"#,
                )
                    .into_response(),
            };
            resp
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    format!("http://127.0.0.1:{port}")
}

fn open(address: &str) -> Driver {
    let mut settings = DriverSettings::default();
    settings.redfish.attempts = 1;
    Driver::open(
        BmcDriver::Redfish,
        address,
        "admin".to_owned().into(),
        "secret-pw".to_owned().into(),
        &settings,
        None,
    )
    .expect("driver")
}

#[tokio::test]
async fn the_good_tree_inspects_and_a_missing_adapter_is_skipped() {
    let d = open(&serve(tree()).await);
    let inv = d.inspect().await.expect("inspect");
    assert_eq!(inv.macs, ["aa:bb:cc:00:00:01"]);
    assert!(inv.drives.is_empty());
}

#[tokio::test]
async fn each_error_shape_names_its_resource() {
    let cases: Vec<(&str, (StatusCode, String), &str)> = vec![
        (
            "/redfish/v1/Systems",
            (StatusCode::NOT_FOUND, String::new()),
            "GET /redfish/v1/Systems: 404 Not Found",
        ),
        (
            "/redfish/v1/Systems/1",
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                json!({"error": {"@Message.ExtendedInfo": [{"Message": "The system is busy."}]}})
                    .to_string(),
            ),
            "GET /redfish/v1/Systems/1: 500 Internal Server Error: The system is busy.",
        ),
        (
            "/redfish/v1/Systems/1",
            (StatusCode::OK, "<html>login</html>".to_owned()),
            "GET /redfish/v1/Systems/1: expected a ComputerSystem",
        ),
        (
            "/redfish/v1/Systems",
            (
                StatusCode::OK,
                json!({"Members": "all of them"}).to_string(),
            ),
            "GET /redfish/v1/Systems: expected a resource collection (Members)",
        ),
        (
            "/redfish/v1/Systems/1/EthernetInterfaces/1",
            (StatusCode::FORBIDDEN, String::new()),
            "GET /redfish/v1/Systems/1/EthernetInterfaces/1: 403 Forbidden",
        ),
        (
            "/redfish/v1",
            (
                StatusCode::OK,
                json!({"RedfishVersion": "1.0.0"}).to_string(),
            ),
            "has no Systems collection",
        ),
    ];
    for (path, answer, says) in cases {
        let mut t = tree();
        t.insert(path.to_owned(), answer);
        let address = serve(t).await;
        let e = open(&address).inspect().await.expect_err(path);
        let text = e.to_string();
        assert!(text.contains(says), "{path}: {text}");
        assert!(text.contains(&address), "{text}");
        assert!(!text.contains("secret-pw"), "{text}");
        if says.contains("no Systems") {
            assert!(matches!(e, BmcError::Unsupported(_)), "{e:?}");
        }
    }
}

#[tokio::test]
async fn a_boot_mode_or_target_the_bmc_does_not_allow_is_unsupported_and_names_the_system() {
    let d = open(&serve(tree()).await);
    let e = d
        .boot(
            bcm_bmc::driver::BootDevice::Pxe,
            false,
            Some(bcm_bmc::driver::BootMode::Legacy),
        )
        .await
        .expect_err("legacy");
    assert!(matches!(e, BmcError::Unsupported(_)), "{e:?}");
    assert!(
        e.to_string().contains(
            "/redfish/v1/Systems/1 does not allow BootSourceOverrideMode Legacy (allows UEFI)"
        ),
        "{e}"
    );
    let e = d
        .boot(bcm_bmc::driver::BootDevice::UefiHttp, false, None)
        .await
        .expect_err("http boot");
    assert!(
        e.to_string()
            .contains("cannot boot from UefiHttp (allows Pxe, Hdd)"),
        "{e}"
    );
}
