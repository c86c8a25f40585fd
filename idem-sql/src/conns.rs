//! The connections a SQL store runs on ([`Conns`]), and the one dispatch
//! path of a store call onto them ([`on_conn!`](crate::on_conn)).

use sqlx::pool::PoolOptions;
use sqlx::{Connection, Database};

use crate::pool::{ConnectCheck, ConnectionError, Pool, PoolConfig, Stats};

/// The connections of one SQL store: one pool that every statement of the
/// store checks out from (its calls, the migration, the transactional mode,
/// the operator API), and the sqlx pool [`Conns::pool`] hands to the user.
///
/// * Built by [`Conns::own`] (the stores' `connect`): the store runs on a
///   [`Pool`] of its own (no ping before or after a call), and the sqlx pool
///   is opened lazily with the same options, for the user's own queries
///   only: it opens no connection unless the user runs one.
/// * Built by [`Conns::yours`] (the stores' `new(pool)`): the store runs on
///   the user's sqlx pool, as given.
pub struct Conns<DB: Database> {
    pool: sqlx::Pool<DB>,
    own: Option<Pool<DB::Connection>>,
}

impl<DB: Database> Clone for Conns<DB> {
    fn clone(&self) -> Self {
        Self {
            pool: self.pool.clone(),
            own: self.own.clone(),
        }
    }
}

impl<DB: Database> std::fmt::Debug for Conns<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conns")
            .field("own", &self.own.as_ref().map(Pool::stats))
            .field("pool_size", &self.pool.size())
            .finish()
    }
}

impl<DB: Database> Conns<DB> {
    /// The store runs on the user's `pool`.
    #[must_use]
    pub fn yours(pool: sqlx::Pool<DB>) -> Self {
        Self { pool, own: None }
    }

    /// The store runs on a [`Pool`] of its own, whose size, acquire timeout,
    /// lifetime and idle timeout come from `options`
    /// ([`PoolConfig::from_pool_options`]); the sqlx pool for the user's own
    /// queries is built from `options` with `test_before_acquire(false)` and
    /// `min_connections(0)`, and opened lazily. Nothing is opened here.
    #[must_use]
    pub fn own(options: PoolOptions<DB>, connect: <DB::Connection as Connection>::Options) -> Self {
        Self::own_checked(options, connect, None)
    }

    /// Like [`Conns::own`], with every new connection of the store's own
    /// pool passing `check` before it serves a call (see [`ConnectCheck`]);
    /// the sqlx pool for the user's own queries is not checked.
    #[must_use]
    pub fn own_checked(
        options: PoolOptions<DB>,
        connect: <DB::Connection as Connection>::Options,
        check: Option<ConnectCheck<DB::Connection>>,
    ) -> Self {
        let own = Pool::checked(
            connect.clone(),
            PoolConfig::from_pool_options(&options),
            check,
        );
        let pool = options
            .test_before_acquire(false)
            .min_connections(0)
            .connect_lazy_with(connect);
        Self {
            pool,
            own: Some(own),
        }
    }

    /// The sqlx pool: the user's (for [`Conns::yours`]), or the lazily
    /// opened one for the user's own queries.
    #[must_use]
    pub fn pool(&self) -> &sqlx::Pool<DB> {
        &self.pool
    }

    /// The store's own pool, if it has one ([`Conns::own`]).
    #[must_use]
    pub fn own_pool(&self) -> Option<&Pool<DB::Connection>> {
        self.own.as_ref()
    }

    /// What the store's own pool holds and did, if it has one.
    #[must_use]
    pub fn stats(&self) -> Option<Stats> {
        self.own.as_ref().map(Pool::stats)
    }

    /// Closes both pools: idle connections now, the others as their calls
    /// end. Every checkout after it fails with [`sqlx::Error::PoolClosed`].
    pub async fn close(&self) {
        if let Some(own) = &self.own {
            own.close();
        }
        self.pool.close().await;
    }
}

/// A SQL store as [`on_conn!`](crate::on_conn) sees it: its connections,
/// and how its calls' errors read.
pub trait SqlStore: Send + Sync {
    /// The database.
    type Db: Database;
    /// The error a store call returns.
    type CallError;

    /// The store's connections.
    fn conns(&self) -> &Conns<Self::Db>;

    /// A checkout that failed, as a call's error.
    fn checkout_error(e: sqlx::Error) -> Self::CallError;

    /// Whether the connection is still sound after a call failed with `e`
    /// (see [`ConnectionError`]).
    fn call_leaves_connection_sound(e: &Self::CallError) -> bool;
}

/// [`SqlStore::checkout_error`] of the store `_` (for
/// [`on_conn!`](crate::on_conn), which names the store, not its type).
#[doc(hidden)]
pub fn checkout_error_of<S: SqlStore>(_: &S) -> fn(sqlx::Error) -> S::CallError {
    S::checkout_error
}

/// [`SqlStore::call_leaves_connection_sound`] of the store `_`.
#[doc(hidden)]
pub fn call_sound_of<S: SqlStore>(_: &S) -> fn(&S::CallError) -> bool {
    S::call_leaves_connection_sound
}

/// A store call's error with the verdict on its connection: whether every
/// statement of the call was answered ([`ConnectionError`]). The verdict is
/// the dialect's, taken when the call fails; [`on_conn!`](crate::on_conn)
/// builds it and unwraps it.
#[derive(Debug)]
pub struct Judged<E> {
    error: E,
    sound: bool,
}

impl<E> Judged<E> {
    /// `error`, judged by `sound`.
    pub fn new(error: E, sound: impl FnOnce(&E) -> bool) -> Self {
        let sound = sound(&error);
        Self { error, sound }
    }

    /// The error itself.
    pub fn into_inner(self) -> E {
        self.error
    }
}

impl<E> ConnectionError for Judged<E> {
    fn leaves_connection_sound(&self) -> bool {
        self.sound
    }
}

/// Runs `$call`, a future of `Result<_, E>` on `$conn: &mut C` (the
/// connection type of the store's database), on one checkout of a store's
/// [`Conns`]: its own pool's (tracked: no ping, see [`Conn`](crate::Conn))
/// or the user's sqlx pool's. A checkout that fails returns early, through
/// `?`, with `$checkout_error(sqlx::Error)`; a call that fails leaves its
/// connection sound or not as `$sound(&E)` says.
///
/// `on_conn!(store, |conn| call)` takes all three from the store's
/// [`SqlStore`] impl (`E` is its `CallError`).
///
/// A macro rather than a function: the call borrows the connection, the
/// store and its arguments, and a function would need a boxed,
/// higher-ranked closure for each call.
#[macro_export]
macro_rules! on_conn {
    ($store:expr, |$conn:ident| $call:expr) => {
        $crate::on_conn!(
            $crate::SqlStore::conns($store),
            $crate::checkout_error_of($store),
            $crate::call_sound_of($store),
            |$conn| $call
        )
    };
    ($conns:expr, $checkout_error:expr, $sound:expr, |$conn:ident| $call:expr) => {
        match $conns.own_pool() {
            Some(own) => {
                let mut checkout = own.get().await.map_err($checkout_error)?;
                checkout
                                            .run(|$conn| async move {
                                                $call
                                                    .await
                                                    .map_err(|e| $crate::Judged::new(e, $sound))
                                            })
                                            .await
                                            .map_err($crate::Judged::into_inner)
            }
            None => {
                // Boxed: sqlx's acquire future is large, and would sit
                // inline in every call's future, on either pool.
                let acquire = ::std::boxed::Box::pin($conns.pool().acquire());
                let mut checkout = acquire.await.map_err($checkout_error)?;
                let $conn = &mut *checkout;
                $call.await
            }
        }
    };
}
