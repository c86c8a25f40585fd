//! A test's fixture (a table, a schema, a stream, queues) torn down even
//! when the test fails.

use std::future::Future;
use std::sync::Arc;

/// What a test made that outlives it unless it is torn down.
pub trait Teardown: Send + Sync + 'static {
    /// Deletes what the test made (and closes what it opened).
    fn teardown(&self) -> impl Future<Output = ()> + Send;
}

/// Runs `body` on `fx` and tears the fixture down even if it panics, then
/// re-raises the panic.
///
/// # Panics
///
/// When `body` does (that is the test failing).
pub async fn with_fixture<Fx, F, Fut>(fx: Fx, body: F)
where
    Fx: Teardown,
    F: FnOnce(Arc<Fx>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let fx = Arc::new(fx);
    let result = tokio::spawn(body(Arc::clone(&fx))).await;
    fx.teardown().await;
    if let Err(e) = result {
        std::panic::resume_unwind(e.into_panic());
    }
}
