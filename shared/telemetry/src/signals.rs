//! The signals that stop a service: Ctrl-C (SIGINT), and SIGTERM from a
//! supervisor (`docker stop`, systemd, Kubernetes). Both cancel one token
//! the service drains on; neither kills it mid-transaction.

use tokio_util::sync::CancellationToken;

/// A token cancelled on the first SIGINT or SIGTERM. Call it inside the
/// runtime, once, at start-up.
pub fn shutdown_token() -> CancellationToken {
    let token = CancellationToken::new();
    let stop = token.clone();
    tokio::spawn(async move {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .map_err(|e| tracing::warn!(error = %e, "no SIGTERM handler; only Ctrl-C stops"))
            .ok();
        let sigterm = async {
            match term.as_mut() {
                Some(t) => {
                    t.recv().await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => tracing::info!("interrupted; stopping"),
            _ = sigterm => tracing::info!("SIGTERM; stopping"),
        }
        stop.cancel();
    });
    token
}
