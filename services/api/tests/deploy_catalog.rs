//! The deploy profile catalog keeps versions immutable: storing the same
//! version again is a no-op, storing it with different content is refused.

use bcm_testkit::TestEnv;

#[tokio::test]
async fn a_stored_version_never_changes() {
    let env = TestEnv::start().await.expect("env");
    let mut profile = bcm_testkit::sim_profile("immutable", 1, "host");
    bcm_db::deploy_profiles::deploy_profile_insert(&env.db, "a", "immutable", 1, &profile)
        .await
        .expect("first store");
    bcm_db::deploy_profiles::deploy_profile_insert(&env.db, "a", "immutable", 1, &profile)
        .await
        .expect("the same content again is a no-op");
    let original = profile.clone();
    profile["role"] = "dedicated".into();
    let err =
        bcm_db::deploy_profiles::deploy_profile_insert(&env.db, "a", "immutable", 1, &profile)
            .await
            .expect_err("changed content under the same version");
    assert!(matches!(err, bcm_db::DbError::Duplicate { .. }), "{err:?}");
    let stored = bcm_db::deploy_profiles::deploy_profiles_of_tenant(&env.db, "a")
        .await
        .expect("list");
    assert!(stored.contains(&original), "the first content stays");
    assert!(!stored.contains(&profile));
    let err = bcm_db::deploy_profiles::deploy_profile_insert(&env.db, "nobody", "x", 1, &original)
        .await
        .expect_err("unknown tenant");
    assert!(
        matches!(err, bcm_db::DbError::MissingReference { .. }),
        "{err:?}"
    );
}
