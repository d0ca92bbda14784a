//! The simulated site's consumer (`site-<site>`) against commands that break
//! the contract: dead-lettered with their reason, no simulated machine is
//! touched, and a good command behind them is still answered.

use bcm_testkit::{Options, TestEnv};
use std::time::Duration;

const T: Duration = Duration::from_secs(60);

#[tokio::test]
async fn the_simulated_site_dead_letters_what_it_cannot_read_and_carries_on() {
    let env = TestEnv::start_with(Options::with_site())
        .await
        .expect("env");
    let site: bcm_core::SiteId = "s1".parse().expect("site");
    env.publish_raw(
        &env.subjects().command(&site, "bmc.verify"),
        b"{\"data\": 1}",
    )
    .await
    .expect("publish");
    env.publish_raw(&env.subjects().command(&site, "site.bootEntry.set"), b"")
        .await
        .expect("publish");
    let dead = env
        .dead_letters("site-s1", 2, T)
        .await
        .expect("dead letters");
    assert!(
        dead.iter().all(|d| d.reason.starts_with("undecodable")),
        "{dead:?}"
    );
    // The site still serves: a machine enrolls to ready behind them.
    let id = env.enroll_sim("after-garbage").await;
    env.wait_state(&id, bcm_core::ProvisionState::Ready, T)
        .await
        .expect("ready");
    env.stop();
}
