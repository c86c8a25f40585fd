//! The signal an example server stops on: SIGTERM or Ctrl-C (Ctrl-C alone
//! where there is no SIGTERM). Shared by `webhook_receiver` and the queue
//! examples (through `ledger.rs`).

/// SIGTERM or Ctrl-C.
pub(crate) async fn stop() {
    #[cfg(unix)]
    {
        let Ok(mut term) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        else {
            let _ = tokio::signal::ctrl_c().await;
            return;
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
