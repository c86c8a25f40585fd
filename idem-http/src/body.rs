//! The response body the layer returns: the handler's own, bytes the layer
//! holds, or the handler's resumed after a prefix the layer already read.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use idem_core::store::BoxDynError;

pin_project_lite::pin_project! {
    /// The layer's response body: the handler's body untouched (streams,
    /// transient answers), bytes the layer holds (a replay, a problem, a
    /// captured response), or the handler's body after the prefix the layer
    /// already read (larger than `max_response_bytes`, or with trailers),
    /// byte-exact.
    pub struct IdemBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project_lite::pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Inner { #[pin] body: B },
        Full { data: Option<Bytes> },
        Resumed { prefix: Option<Bytes>, trailers: Option<HeaderMap>, rest: Pin<Box<B>> },
    }
}

impl<B> fmt::Debug for IdemBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.kind {
            Kind::Inner { .. } => "Inner",
            Kind::Full { .. } => "Full",
            Kind::Resumed { .. } => "Resumed",
        };
        f.debug_tuple("IdemBody").field(&kind).finish()
    }
}

impl<B> IdemBody<B> {
    /// The handler's body.
    pub(crate) fn inner(body: B) -> Self {
        Self {
            kind: Kind::Inner { body },
        }
    }

    /// Bytes held by the layer.
    pub(crate) fn full(data: impl Into<Bytes>) -> Self {
        let data: Bytes = data.into();
        Self {
            kind: Kind::Full {
                data: (!data.is_empty()).then_some(data),
            },
        }
    }

    pub(crate) fn resumed(prefix: Bytes, trailers: Option<HeaderMap>, rest: Pin<Box<B>>) -> Self {
        Self {
            kind: Kind::Resumed {
                prefix: (!prefix.is_empty()).then_some(prefix),
                trailers,
                rest,
            },
        }
    }
}

impl<B> Body for IdemBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxDynError>,
{
    type Data = Bytes;
    type Error = BoxDynError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxDynError>>> {
        match self.project().kind.project() {
            KindProj::Inner { body } => body.poll_frame(cx).map_err(Into::into),
            KindProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            KindProj::Resumed {
                prefix,
                trailers,
                rest,
            } => {
                if let Some(p) = prefix.take() {
                    return Poll::Ready(Some(Ok(Frame::data(p))));
                }
                if let Some(t) = trailers.take() {
                    return Poll::Ready(Some(Ok(Frame::trailers(t))));
                }
                rest.as_mut().poll_frame(cx).map_err(Into::into)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Full { data } => data.is_none(),
            Kind::Resumed {
                prefix,
                trailers,
                rest,
            } => prefix.is_none() && trailers.is_none() && rest.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } => body.size_hint(),
            Kind::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            Kind::Resumed { prefix, rest, .. } => {
                let p = prefix.as_ref().map_or(0, |d| d.len() as u64);
                let h = rest.size_hint();
                let mut s = SizeHint::new();
                s.set_lower(h.lower() + p);
                if let Some(u) = h.upper() {
                    s.set_upper(u + p);
                }
                s
            }
        }
    }
}
