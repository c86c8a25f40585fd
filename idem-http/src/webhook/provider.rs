//! Who sends the deliveries: the signature scheme, where the event id is,
//! and how long the provider keeps redelivering (the retention `build`
//! asks for).

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderName;

use super::verify::{GitHub, Secret, StandardWebhooks, Stripe, Verify};

/// `n` hours.
const fn hours(n: u64) -> Duration {
    Duration::from_secs(n * 3600)
}

/// Where a delivery's event id (the record's key) comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum EventId {
    /// The id the signature covers, as the verifier reports it (Standard
    /// Webhooks and Svix: the `webhook-id` or `svix-id` of the header set
    /// that verified). An id no one signed cannot be swapped for another to
    /// replay a captured delivery as a new event.
    Signed,
    /// A header (`X-GitHub-Delivery`), as sent.
    Header(HeaderName),
    /// A JSON pointer into the verified body (Stripe: `/id`). The body is
    /// parsed only after verification, strictly: a member named twice is
    /// 400 `malformed_webhook`.
    JsonPointer(Cow<'static, str>),
    /// The SHA-256 of the body, for a provider whose id header is not
    /// signed (GitHub's `X-GitHub-Delivery`) when a replay under a forged id
    /// must not run again; two deliveries with identical bodies are then
    /// one event.
    BodyHash,
}

/// A webhook sender: its signature scheme, where its event id is, and the
/// shortest retention that covers its redeliveries.
#[derive(Clone)]
pub struct Provider {
    pub(crate) name: Cow<'static, str>,
    pub(crate) verifier: Arc<dyn Verify>,
    pub(crate) event_id: EventId,
    pub(crate) min_retention: Duration,
}

impl fmt::Debug for Provider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Provider")
            .field("name", &self.name)
            .field("event_id", &self.event_id)
            .field("min_retention", &self.min_retention)
            .finish_non_exhaustive()
    }
}

impl Provider {
    /// Standard Webhooks v1: `webhook-id`, `webhook-timestamp` and
    /// `webhook-signature: v1,<base64> …` over `{id}.{timestamp}.{body}`,
    /// secrets from [`Secret::whsec`]; the id is the key. Retention at least
    /// 76 h (the specification's example schedule, 75 h 35 min).
    pub fn standard_webhooks(secrets: impl IntoIterator<Item = Secret>) -> Self {
        let verifier = StandardWebhooks {
            secrets: secrets.into_iter().collect(),
            names: vec![StandardWebhooks::names("webhook")],
        };
        Self::custom("standard_webhooks", verifier, EventId::Signed, hours(76))
    }

    /// Svix: the Standard Webhooks scheme under `svix-*` names, or under
    /// `webhook-*` (white-labelled senders such as Resend, Clerk); secrets
    /// from [`Secret::whsec`]. Retention at least 28 h (8 attempts over
    /// 27 h 35 min).
    pub fn svix(secrets: impl IntoIterator<Item = Secret>) -> Self {
        let verifier = StandardWebhooks {
            secrets: secrets.into_iter().collect(),
            names: vec![
                StandardWebhooks::names("svix"),
                StandardWebhooks::names("webhook"),
            ],
        };
        Self::custom("svix", verifier, EventId::Signed, hours(28))
    }

    /// Stripe: `Stripe-Signature: t=<unix>,v1=<hex>` over `{t}.{body}`, the
    /// `whsec_…` string itself as the key ([`Secret::new`]); the event id is
    /// the body's `/id` (`evt_…`). Retention at least 72 h (live mode
    /// retries for up to three days).
    pub fn stripe(secrets: impl IntoIterator<Item = Secret>) -> Self {
        let verifier = Stripe {
            secrets: secrets.into_iter().collect(),
        };
        let id = EventId::JsonPointer(Cow::Borrowed("/id"));
        Self::custom("stripe", verifier, id, hours(72))
    }

    /// GitHub: `X-Hub-Signature-256: sha256=<hex>` over the body, the
    /// secret's bytes as the key ([`Secret::new`]); the event id is
    /// `X-GitHub-Delivery`, kept by a manual redelivery. Retention at least
    /// 72 h (GitHub redelivers only by hand; 72 h is a floor, not its
    /// window).
    ///
    /// GitHub signs no timestamp and not the delivery header: a captured
    /// request replayed verbatim is a duplicate for `key_ttl`, but one
    /// replayed under a new `X-GitHub-Delivery` is a new event. Where that
    /// matters, key on the body with `.event_id(EventId::BodyHash)`.
    pub fn github(secrets: impl IntoIterator<Item = Secret>) -> Self {
        let verifier = GitHub {
            secrets: secrets.into_iter().collect(),
        };
        let id = EventId::Header(HeaderName::from_static("x-github-delivery"));
        Self::custom("github", verifier, id, hours(72))
    }

    /// Another sender: its verifier, its event id, the shortest retention
    /// that covers its redeliveries, and a name for the operation
    /// (`webhook <name>`), the metrics and the logs.
    pub fn custom(
        name: impl Into<Cow<'static, str>>,
        verifier: impl Verify,
        event_id: EventId,
        min_retention: Duration,
    ) -> Self {
        Self {
            name: name.into(),
            verifier: Arc::new(verifier),
            event_id,
            min_retention,
        }
    }

    /// The provider's name (`stripe`, `github`, `svix`,
    /// `standard_webhooks`, or a custom one).
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The shortest `key_ttl` that covers its redeliveries.
    #[must_use]
    pub fn min_retention(&self) -> Duration {
        self.min_retention
    }
}
