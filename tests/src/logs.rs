//! Captured `tracing` events, for tests that assert what the limiter logs.
//!
//! [`capture`] installs a global subscriber once per test binary (a binary that calls it must
//! not install another); [`events`] returns every event seen since, with its level, message and
//! fields. It records only the events of the `ratelimit_*` crates (the limiter's targets,
//! `ratelimit_runtime::observe::log`): every test of the one integration test binary runs under
//! it once a test has called [`capture`], and the HTTP and gRPC stacks' own events would only
//! slow them and grow the capture. Tests of one binary share the capture: filter by something
//! of their own (a scope, a value) rather than counting every event.
//!
//! ```no_run
//! ratelimit_tests::logs::capture();
//! tracing::warn!(target: "ratelimit_tests", scope = "demo", "something happened");
//! assert!(ratelimit_tests::logs::events().iter().any(|e| e.field("scope") == Some("demo")));
//! ```
#![allow(
    clippy::missing_panics_doc,
    reason = "a poisoned capture is a test that already panicked"
)]

use std::sync::{Mutex, Once};

/// One captured event.
#[derive(Debug, Clone)]
pub struct Event {
    /// Its level.
    pub level: tracing::Level,
    /// Its message.
    pub message: String,
    /// Its other fields, in order, as `(name, value)`; strings without their quotes.
    pub fields: Vec<(String, String)>,
}

impl Event {
    /// The value of field `name`, if the event has it.
    pub fn field(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

static EVENTS: Mutex<Vec<Event>> = Mutex::new(Vec::new());

struct Visit<'a>(&'a mut Event);

impl tracing::field::Visit for Visit<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        let value = format!("{value:?}");
        if field.name() == "message" {
            self.0.message = value;
        } else {
            self.0
                .fields
                .push((field.name().to_owned(), value.trim_matches('"').to_owned()));
        }
    }

    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == "message" {
            value.clone_into(&mut self.0.message);
        } else {
            self.0
                .fields
                .push((field.name().to_owned(), value.to_owned()));
        }
    }
}

struct Subscriber;

impl tracing::Subscriber for Subscriber {
    fn enabled(&self, metadata: &tracing::Metadata<'_>) -> bool {
        metadata.target().starts_with("ratelimit")
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut captured = Event {
            level: *event.metadata().level(),
            message: String::new(),
            fields: Vec::new(),
        };
        event.record(&mut Visit(&mut captured));
        EVENTS.lock().unwrap().push(captured);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// Installs the capturing subscriber (once; later calls do nothing).
pub fn capture() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        tracing::subscriber::set_global_default(Subscriber).expect("the only subscriber");
    });
}

/// Every event captured so far.
pub fn events() -> Vec<Event> {
    EVENTS.lock().unwrap().clone()
}
