//! Kubernetes Events (`events.k8s.io/v1`) about DataStages and gated pods.
//!
//! An Event that repeats within a few minutes is not created again: the
//! first one becomes a series and its count goes up, as kube-runtime's
//! `Recorder` and client-go's recorder do, so that `kubectl describe`
//! shows "x5" instead of five lines. The `Recorder` remembers a whole copy
//! of every Event for six minutes to do that; a heap profile of the
//! operator at 1,000 DataStages (about 7,000 Events in six minutes) found
//! that map at 17 MiB of a 64 MiB peak, over a quarter of the operator's
//! heap. [`EventPublisher`] remembers only what a repeat needs (the Event's
//! name and count) for a bounded number of series.

use std::collections::HashMap;
use std::hash::{Hash, Hasher as _};
use std::sync::Mutex;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event as K8sEvent, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Reporter};
use kube::{Api, Client};
use serde_json::json;

/// How long a repeat still joins its series: the `Recorder`'s six minutes.
const SERIES_WINDOW: SignedDuration = SignedDuration::from_mins(6);

/// The most series remembered at once. Past it, an Event is still
/// published, and a repeat of it makes a new Event instead of counting up:
/// a longer `kubectl describe`, never a lost Event.
const MAX_SERIES: usize = 4096;

/// The longest note the API server takes (`events.k8s.io/v1` validation).
const MAX_NOTE_BYTES: usize = 1024;

/// What makes two Events the same series: the object, the reporter's
/// reason, action and type, and the note (kept as a hash), so that a
/// repeat says the same thing the first one did.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct SeriesKey {
    namespace: Option<String>,
    uid: Option<String>,
    name: Option<String>,
    reason: String,
    action: String,
    warning: bool,
    note: u64,
}

impl SeriesKey {
    fn of(event: &Event, regarding: &ObjectReference) -> Self {
        let mut note = std::collections::hash_map::DefaultHasher::new();
        event.note.hash(&mut note);
        SeriesKey {
            namespace: regarding.namespace.clone(),
            uid: regarding.uid.clone(),
            name: regarding.name.clone(),
            reason: event.reason.clone(),
            action: event.action.clone(),
            warning: matches!(event.type_, EventType::Warning),
            note: note.finish(),
        }
    }
}

/// A published Event that repeats would count up.
#[derive(Clone, Debug, PartialEq)]
struct Series {
    name: String,
    count: i32,
    last: Timestamp,
}

/// What to do with an Event: create it, or count a repeat of `name`.
#[derive(Debug, PartialEq)]
enum Publish {
    Create,
    Repeat { name: String, count: i32 },
}

/// The series published in the last [`SERIES_WINDOW`], at most
/// [`MAX_SERIES`] of them. Pure bookkeeping, without a client.
#[derive(Debug, Default)]
struct SeriesBook {
    series: HashMap<SeriesKey, Series>,
    swept: Option<Timestamp>,
}

impl SeriesBook {
    /// Whether the Event with `key` is new or a repeat at `now`; a repeat
    /// is counted at once, so that concurrent repeats count each other.
    fn publish(&mut self, key: &SeriesKey, now: Timestamp) -> Publish {
        self.sweep(now);
        match self.series.get_mut(key) {
            Some(series) if series.last + SERIES_WINDOW > now => {
                series.count += 1;
                series.last = now;
                Publish::Repeat { name: series.name.clone(), count: series.count }
            }
            _ => Publish::Create,
        }
    }

    /// Remembers the Event `name` just created for `key`, unless the book
    /// is full.
    fn created(&mut self, key: SeriesKey, name: String, now: Timestamp) {
        if self.series.len() < MAX_SERIES || self.series.contains_key(&key) {
            self.series.insert(key, Series { name, count: 1, last: now });
        }
    }

    /// Forgets `key`, whose Event is gone.
    fn forget(&mut self, key: &SeriesKey) {
        self.series.remove(key);
    }

    /// Drops series past their window, at most once a second: a sweep is
    /// a walk over every series.
    fn sweep(&mut self, now: Timestamp) {
        if self.swept.is_some_and(|at| at + SignedDuration::from_secs(1) > now) {
            return;
        }
        self.swept = Some(now);
        self.series.retain(|_, s| s.last + SERIES_WINDOW > now);
        if self.series.capacity() > 2 * self.series.len().max(64) {
            self.series.shrink_to_fit();
        }
    }
}

/// Publishes Events as `reporter`, folding repeats into series.
pub struct EventPublisher {
    client: Client,
    reporter: Reporter,
    book: Mutex<SeriesBook>,
}

impl EventPublisher {
    /// A publisher that reports as `reporter`.
    pub fn new(client: Client, reporter: Reporter) -> Self {
        EventPublisher { client, reporter, book: Mutex::default() }
    }

    /// Publishes `event` about `regarding`, in its namespace.
    ///
    /// # Errors
    /// The API server refused the Event or could not be reached.
    pub async fn publish(&self, event: &Event, regarding: &ObjectReference) -> Result<(), kube::Error> {
        let now = Timestamp::now();
        let key = SeriesKey::of(event, regarding);
        let namespace = regarding.namespace.as_deref().unwrap_or("default");
        let events: Api<K8sEvent> = Api::namespaced(self.client.clone(), namespace);
        let publish = self.book.lock().expect("the series book").publish(&key, now);
        if let Publish::Repeat { name, count } = publish {
            let series = EventSeries { count, last_observed_time: MicroTime(now) };
            match events.patch(&name, &PatchParams::default(), &Patch::Merge(json!({"series": series}))).await {
                Ok(_) => return Ok(()),
                // Deleted, or expired by the API server's event TTL: start again.
                Err(kube::Error::Api(status)) if status.code == 404 => {
                    self.book.lock().expect("the series book").forget(&key);
                }
                Err(error) => return Err(error),
            }
        }
        let created =
            events.create(&PostParams::default(), &build_event(&self.reporter, event, regarding, now)).await?;
        let name = created.metadata.name.unwrap_or_default();
        self.book.lock().expect("the series book").created(key, name, now);
        Ok(())
    }
}

/// The Event object `reporter` publishes for `event` about `regarding` at
/// `now`.
fn build_event(reporter: &Reporter, event: &Event, regarding: &ObjectReference, now: Timestamp) -> K8sEvent {
    let controller = &reporter.controller;
    K8sEvent {
        metadata: ObjectMeta {
            name: Some(format!("{}.{:x}", regarding.name.as_deref().unwrap_or(controller), now.as_nanosecond())),
            namespace: regarding.namespace.clone(),
            ..ObjectMeta::default()
        },
        event_time: Some(MicroTime(now)),
        action: Some(event.action.clone()),
        reason: Some(event.reason.clone()),
        note: event.note.as_deref().map(truncate_note),
        type_: Some(if matches!(event.type_, EventType::Warning) { "Warning" } else { "Normal" }.to_owned()),
        regarding: Some(regarding.clone()),
        related: event.secondary.clone(),
        reporting_controller: Some(controller.clone()),
        reporting_instance: Some(reporter.instance.clone().unwrap_or_else(|| controller.clone())),
        ..K8sEvent::default()
    }
}

/// `note` cut to what the API server accepts, on a character boundary.
fn truncate_note(note: &str) -> String {
    if note.len() <= MAX_NOTE_BYTES {
        return note.to_owned();
    }
    let mut end = MAX_NOTE_BYTES - '…'.len_utf8();
    while !note.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &note[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(reason: &str, note: &str) -> Event {
        Event {
            type_: EventType::Normal,
            reason: reason.into(),
            note: Some(note.into()),
            action: "Sync".into(),
            secondary: None,
        }
    }

    fn object(name: &str) -> ObjectReference {
        ObjectReference {
            namespace: Some("team-a".into()),
            name: Some(name.into()),
            uid: Some(format!("uid-{name}")),
            ..ObjectReference::default()
        }
    }

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).unwrap()
    }

    #[test]
    fn a_repeat_within_the_window_counts_up_the_first_event() {
        let mut book = SeriesBook::default();
        let key = SeriesKey::of(&event("Staged", "6 objects"), &object("a"));
        assert_eq!(book.publish(&key, at(0)), Publish::Create);
        book.created(key.clone(), "a.1".into(), at(0));
        assert_eq!(book.publish(&key, at(10)), Publish::Repeat { name: "a.1".into(), count: 2 });
        assert_eq!(book.publish(&key, at(20)), Publish::Repeat { name: "a.1".into(), count: 3 });
        // The window runs from the last repeat.
        assert_eq!(book.publish(&key, at(20 + 359)), Publish::Repeat { name: "a.1".into(), count: 4 });
        assert_eq!(book.publish(&key, at(20 + 359 + 361)), Publish::Create, "past the window");
    }

    #[test]
    fn another_object_reason_or_note_is_another_series() {
        let mut book = SeriesBook::default();
        let first = SeriesKey::of(&event("Staged", "6 objects"), &object("a"));
        book.created(first.clone(), "a.1".into(), at(0));
        for other in [
            SeriesKey::of(&event("Staged", "6 objects"), &object("b")),
            SeriesKey::of(&event("Failed", "6 objects"), &object("a")),
            SeriesKey::of(&event("Staged", "7 objects"), &object("a")),
            SeriesKey::of(&Event { type_: EventType::Warning, ..event("Staged", "6 objects") }, &object("a")),
        ] {
            assert_eq!(book.publish(&other, at(1)), Publish::Create, "{other:?}");
        }
        assert!(matches!(book.publish(&first, at(2)), Publish::Repeat { count: 2, .. }));
    }

    #[test]
    fn the_book_forgets_old_series_and_holds_at_most_max_series() {
        let mut book = SeriesBook::default();
        let key = |i: usize| SeriesKey::of(&event("Staged", &i.to_string()), &object("a"));
        for i in 0..MAX_SERIES + 10 {
            book.publish(&key(i), at(0));
            book.created(key(i), format!("a.{i}"), at(0));
        }
        assert_eq!(book.series.len(), MAX_SERIES);
        assert_eq!(book.publish(&key(MAX_SERIES + 5), at(1)), Publish::Create, "not remembered: published anew");
        assert!(matches!(book.publish(&key(0), at(2)), Publish::Repeat { .. }));
        book.publish(&key(1), at(2 + 361));
        assert!(book.series.is_empty(), "swept after the window");
        // A forgotten Event (deleted on the server) starts a new series.
        book.created(key(0), "a.0".into(), at(400));
        book.forget(&key(0));
        assert_eq!(book.publish(&key(0), at(401)), Publish::Create);
    }

    #[test]
    fn notes_are_cut_to_what_the_api_server_accepts() {
        assert_eq!(truncate_note("short"), "short");
        let long = "é".repeat(600);
        let cut = truncate_note(&long);
        assert!(cut.len() <= MAX_NOTE_BYTES && cut.ends_with('…'), "{}", cut.len());
        assert!(long.starts_with(cut.trim_end_matches('…')));
    }

    #[test]
    fn an_event_names_its_object_reporter_and_type() {
        let reporter = Reporter { controller: "ferry.dev/operator".into(), instance: Some("op-1".into()) };
        let warning = Event { type_: EventType::Warning, ..event("SecretNotFound", "no Secret s3") };
        let built = build_event(&reporter, &warning, &object("a"), at(0));
        assert_eq!(built.metadata.namespace.as_deref(), Some("team-a"));
        assert!(built.metadata.name.as_deref().is_some_and(|n| n.starts_with("a.")), "{:?}", built.metadata.name);
        assert_eq!(built.regarding.as_ref().and_then(|r| r.uid.as_deref()), Some("uid-a"));
        assert_eq!(
            (built.type_.as_deref(), built.reason.as_deref(), built.action.as_deref(), built.note.as_deref()),
            (Some("Warning"), Some("SecretNotFound"), Some("Sync"), Some("no Secret s3"))
        );
        assert_eq!(
            (built.reporting_controller.as_deref(), built.reporting_instance.as_deref()),
            (Some("ferry.dev/operator"), Some("op-1"))
        );
        assert!(built.series.is_none() && built.event_time.is_some());
        let unnamed = Reporter { instance: None, ..reporter };
        let built = build_event(&unnamed, &event("Staged", "x"), &object("b"), at(1));
        assert_eq!(built.reporting_instance.as_deref(), Some("ferry.dev/operator"));
        assert_eq!(built.type_.as_deref(), Some("Normal"));
    }
}
