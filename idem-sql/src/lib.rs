#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod batch;
mod conns;
mod error;
mod ident;
mod layout;
mod pool;
mod row;
mod statement;
mod store;
mod tx;

pub use batch::{BatchCompletion, MAX_BATCH, SettleClaim};
pub use conns::{Conns, Judged, SqlStore, call_sound_of, checkout_error_of};
pub use error::{Class, classify, fenced, leaves_connection_sound, to_store_error};
pub use idem_core::store::Coalescing;
pub use ident::check_identifier;
pub use layout::{LAYOUT, LayoutError, check_layout};
pub use pool::{Conn, ConnectCheck, ConnectionError, Pool, PoolConfig, Stats};
pub use row::{
    RowError, attempt_of, batch_position, check_identity, decode_counts, decode_record,
    decode_summary, text, truncate,
};
pub use statement::{Driver, Param, SharedStatements, Statement, Value, query, statement};
#[doc(hidden)]
pub use store::__private;
pub use store::{
    BindRecord, DbConnection, DbRow, Dialect, Fenced, KeysetAfter, SqlCore, TxStore,
    claim_batch_in_tx, keyed, record_key,
};
pub use tx::{SqlIdemExt, TxConnection, TxFuture};
