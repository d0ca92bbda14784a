//! Listing and reading nodes: filters, pagination, and visibility by grant.

use bcm_core::ProvisionState;
use bcm_testkit::TestEnv;

#[tokio::test]
async fn list_filters_paginates_and_respects_grants() {
    let env = TestEnv::start().await.expect("env");
    let mut a_ids = vec![];
    for _ in 0..5 {
        let n = env.enroll("a", "a-pool").await.expect("enroll");
        a_ids.push(n["nodeId"].as_str().expect("id").to_owned());
    }
    for _ in 0..2 {
        env.enroll("b", "b-pool").await.expect("enroll");
    }
    let first: bcm_core::NodeId = a_ids[0].parse().expect("id");
    env.force_state(&first, ProvisionState::Ready, None)
        .await
        .expect("ready");

    let reader = env
        .token("a-reader", &[("compute:nodes:read", "tenant", "a")])
        .await
        .expect("token");
    let mut seen = vec![];
    let mut token: Option<String> = None;
    let mut pages = 0;
    loop {
        let q = match &token {
            Some(t) => format!("/api/compute/metal/nodes?limit=2&pageToken={t}"),
            None => "/api/compute/metal/nodes?limit=2".to_owned(),
        };
        let (s, page) = env.get(&q, Some(&reader)).await.expect("list");
        assert_eq!(s, 200, "{page}");
        pages += 1;
        for item in page["items"].as_array().expect("items") {
            assert_eq!(item["tenantId"], "a");
            seen.push(item["nodeId"].as_str().expect("id").to_owned());
        }
        match page["nextPageToken"].as_str() {
            Some(t) => token = Some(t.to_owned()),
            None => break,
        }
    }
    assert_eq!(pages, 3);
    assert_eq!(seen, a_ids, "every node of A once, in id order");

    let (_, ready) = env
        .get("/api/compute/metal/nodes?state=ready", Some(&reader))
        .await
        .expect("list");
    assert_eq!(ready["items"].as_array().map(Vec::len), Some(1));
    assert_eq!(ready["items"][0]["nodeId"], a_ids[0]);

    let (_, all) = env
        .get(
            "/api/compute/metal/nodes?limit=1000",
            Some(&env.admin_token),
        )
        .await
        .expect("list");
    assert_eq!(all["items"].as_array().map(Vec::len), Some(7));
    let (_, b_only) = env
        .get(
            "/api/compute/metal/nodes?tenantId=b",
            Some(&env.admin_token),
        )
        .await
        .expect("list");
    assert_eq!(b_only["items"].as_array().map(Vec::len), Some(2));

    let pool_reader = env
        .token("pool-reader", &[("compute:nodes:read", "pool", "b-pool")])
        .await
        .expect("token");
    let (_, pool) = env
        .get("/api/compute/metal/nodes", Some(&pool_reader))
        .await
        .expect("list");
    assert_eq!(pool["items"].as_array().map(Vec::len), Some(2));
    let (s, one) = env
        .get(
            &format!("/api/compute/metal/nodes/{}", a_ids[1]),
            Some(&reader),
        )
        .await
        .expect("get");
    assert_eq!(s, 200);
    assert_eq!(one["provisionState"], "enrolling");
    assert_eq!(one["macs"], serde_json::json!([]));
}
