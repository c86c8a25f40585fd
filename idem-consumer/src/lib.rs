#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

/// `Clone` and `Debug` for a broker adapter over a `Consumer<S>`, field by
/// field: a derive would ask `S: Clone` / `S: Debug`, where the consumer is
/// cheap to clone and printable for every store. Hooks (boxed closures)
/// print as whether one is set.
#[cfg(any(feature = "nats", feature = "rabbitmq", feature = "sqs-lambda"))]
macro_rules! adapter_impls {
    ($name:ident { $($field:ident),+ } hooks { $($hook:ident),* }) => {
        impl<S: Store> Clone for $name<S> {
            fn clone(&self) -> Self {
                Self {
                    $($field: self.$field.clone(),)+
                    $($hook: self.$hook.clone(),)*
                }
            }
        }

        impl<S: Store> fmt::Debug for $name<S> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct(stringify!($name))
                    $(.field(stringify!($field), &self.$field))+
                    $(.field(stringify!($hook), &self.$hook.is_some()))*
                    .finish()
            }
        }
    };
}

mod backoff;
mod config;
mod disposition;
#[cfg(feature = "sql")]
mod inbox;
mod process;

#[cfg(feature = "nats")]
#[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
pub mod nats;

#[cfg(feature = "rabbitmq")]
#[cfg_attr(docsrs, doc(cfg(feature = "rabbitmq")))]
pub mod rabbitmq;

#[cfg(feature = "sqs-lambda")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqs-lambda")))]
pub mod sqs;

pub use config::{
    Consumer, ConsumerBuilder, ConsumerConfigError, ConsumerPermanentFailure, FingerprintMode,
};
pub use disposition::{Cause, DeadLetterReason, Disposition, Processed};
pub use process::Delivered;
