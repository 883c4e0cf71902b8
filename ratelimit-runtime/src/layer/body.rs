//! [`LayerBody`]: the inner service's body, or the body of a response the layer answered.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Mutex, PoisonError};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::call::Admitted;

pin_project! {
    /// The body of a [`super::RateLimitService`] response: the inner service's body when the
    /// request was admitted, or the layer's own (the JSON of a 429/503/4xx, or nothing for a
    /// gRPC trailers-only answer).
    ///
    /// A [`http_body::Body`] with the inner body's error type, so Axum (`Router::layer`) and
    /// tonic (`Server::builder().layer`) serve it as they serve their own.
    ///
    /// ```
    /// use http_body::Body as _;
    /// use ratelimit_runtime::layer::LayerBody;
    ///
    /// let body: LayerBody<String> = LayerBody::new("hello".to_owned());
    /// assert_eq!(body.size_hint().exact(), Some(5));
    /// ```
    #[derive(Debug)]
    pub struct LayerBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    #[derive(Debug)]
    enum Kind<B> {
        Inner { #[pin] body: B },
        // A gRPC response whose status comes in its trailers, with a count filter to settle.
        Settling { #[pin] body: B, settle: Settle },
        Full { data: Option<Bytes> },
    }
}

impl<B> LayerBody<B> {
    /// The inner service's body, passed through.
    pub fn new(body: B) -> Self {
        Self {
            kind: Kind::Inner { body },
        }
    }

    /// The inner service's body, its call settled by the `grpc-status` of its trailers before
    /// they are passed on (so the client sees the end of the call after the refund); a body
    /// that ends without trailers, or is dropped, counts.
    pub(crate) fn settling(body: B, admitted: Admitted<'static>) -> Self {
        Self {
            kind: Kind::Settling {
                body,
                settle: Settle {
                    admitted: Some(admitted),
                    running: None,
                    trailers: None,
                },
            },
        }
    }

    /// A body of the layer's own: `data`, or nothing when it is empty.
    pub(crate) fn full(data: Bytes) -> Self {
        Self {
            kind: Kind::Full {
                data: (!data.is_empty()).then_some(data),
            },
        }
    }

    /// No body (a gRPC trailers-only answer).
    pub(crate) fn empty() -> Self {
        Self {
            kind: Kind::Full { data: None },
        }
    }
}

impl<B: Body<Data = Bytes>> Body for LayerBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.project().kind.project() {
            KindProj::Inner { body } => body.poll_frame(cx),
            KindProj::Settling { body, settle } => settle.poll_frame(body, cx),
            KindProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Settling { body, settle } => {
                settle.running.is_none() && settle.trailers.is_none() && body.is_end_stream()
            }
            Kind::Full { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } | Kind::Settling { body, .. } => body.size_hint(),
            Kind::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}

/// The settling of a call by its trailers.
pub(crate) struct Settle {
    /// Until the trailers come.
    admitted: Option<Admitted<'static>>,
    /// The refund under way (in a `Mutex`, never locked, only so that the body stays `Sync`).
    running: Option<Mutex<Pin<Box<dyn Future<Output = ()> + Send>>>>,
    /// The trailers, passed on once the refund is done.
    trailers: Option<HeaderMap>,
}

impl fmt::Debug for Settle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settle")
            .field("pending", &self.admitted.is_some())
            .field("running", &self.running.is_some())
            .finish_non_exhaustive()
    }
}

impl Settle {
    fn poll_frame<B: Body<Data = Bytes>>(
        &mut self,
        mut body: Pin<&mut B>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        loop {
            if let Some(running) = &mut self.running {
                let future = running.get_mut().unwrap_or_else(PoisonError::into_inner);
                if future.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                self.running = None;
                return Poll::Ready(self.trailers.take().map(|t| Ok(Frame::trailers(t))));
            }
            let frame = match body.as_mut().poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(frame) => frame,
            };
            match frame {
                Some(Ok(frame)) if frame.is_trailers() => {
                    let Some(admitted) = self.admitted.take() else {
                        return Poll::Ready(Some(Ok(frame)));
                    };
                    let outcome = frame
                        .trailers_ref()
                        .and_then(|t| t.get(super::grpc::STATUS))
                        .map(super::grpc::outcome);
                    let Some(outcome) = outcome else {
                        // No status: the call counts (dropping it keeps what it took).
                        drop(admitted);
                        return Poll::Ready(Some(Ok(frame)));
                    };
                    self.trailers = frame.into_trailers().ok();
                    self.running = Some(Mutex::new(Box::pin(admitted.settle(outcome))));
                }
                Some(Ok(frame)) => return Poll::Ready(Some(Ok(frame))),
                other => {
                    // The end without trailers, or an error: the call counts.
                    self.admitted = None;
                    return Poll::Ready(other);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::task::Waker;

    fn frames(mut body: LayerBody<String>) -> Vec<Bytes> {
        let mut cx = Context::from_waker(Waker::noop());
        let mut out = Vec::new();
        while let Poll::Ready(Some(frame)) = Pin::new(&mut body).poll_frame(&mut cx) {
            out.push(frame.unwrap().into_data().unwrap());
        }
        assert!(body.is_end_stream());
        out
    }

    #[test]
    fn own_bodies_are_one_frame_or_none() {
        let full = LayerBody::<String>::full(Bytes::from_static(b"{}"));
        assert_eq!(full.size_hint().exact(), Some(2));
        assert!(!full.is_end_stream());
        assert_eq!(frames(full), vec![Bytes::from_static(b"{}")]);
        let empty = LayerBody::<String>::empty();
        assert!(empty.is_end_stream());
        assert_eq!(empty.size_hint().exact(), Some(0));
        assert!(frames(empty).is_empty());
        assert!(frames(LayerBody::full(Bytes::new())).is_empty());
    }

    #[test]
    fn inner_bodies_pass_through() {
        let body = LayerBody::new("abc".to_owned());
        assert_eq!(body.size_hint().exact(), Some(3));
        assert_eq!(frames(body), vec![Bytes::from_static(b"abc")]);
    }
}
