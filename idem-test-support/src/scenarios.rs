//! The one way the kits of this crate turn a list of scenarios into tests.

/// Expands one `#[tokio::test]` per scenario `$name` of the kit module
/// `$kit` (a module of this crate whose scenarios are
/// `pub async fn name<S: Store>(store: Arc<S>)`), each running on a fresh
/// fixture from `$setup` through `idem_core::testkit::run`, on a
/// multi-threaded runtime of `$threads` workers. The kits' own macros
/// (`http_conformance!`, `consumer_conformance!`) hold their lists and call
/// this, as `idem_core::store_conformance!` does for the store suite.
#[doc(hidden)]
#[macro_export]
macro_rules! __scenario_tests {
    ($kit:ident, $threads:literal, $setup:expr; $($name:ident),+ $(,)?) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = $threads)]
            async fn $name() {
                ::idem_core::testkit::run($setup, |store| $crate::$kit::$name(store)).await;
            }
        )+
    };
}
