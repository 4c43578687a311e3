//! Backing off together when the store throttles, with nobody to
//! coordinate: the request-rate cap a run learns from refusals.
//!
//! Adaptive concurrency halves the requests a run keeps in flight when the
//! store throttles ([`super::adaptive`]), but not below its floor, and
//! twenty workers at four requests each are eighty requests in flight: a
//! store that serves sixteen at once refuses most of them. A store budget
//! (see `StoreBudget`) splits a known limit; without one, each run also caps
//! the *rate* at which its requests start, and learns that cap as TCP
//! learns its window (AIMD):
//!
//! * **Decrease.** A window in which the store refused more than
//!   [`MARGIN`] of its answers beyond its usual fraction (below) sets the
//!   cap just under what the store accepted from the run in that window
//!   (at most to a quarter of what it asked for).
//!   Runs that share a bucket see its refusals at once and back off
//!   together, so their total falls just under what the store serves.
//! * **Increase.** Each window without excess refusals raises the cap by
//!   [`ADDITIVE`] requests per second per second, the same for every run
//!   whatever its cap (so runs that started unequal converge on equal
//!   parts: the decrease takes more from the larger), and lifts it once it
//!   is well above what the run asks for.
//! * **Noise, and a store's own refusals, are not a limit.** A window
//!   whose refused fraction is at most [`MARGIN`] is quiet: a stray 503
//!   among a hundred answers says nothing. Refusals a store goes on sending
//!   whatever the rate (a proxy that sheds a share of requests at random, a
//!   fault) become the usual fraction within about [`USUAL_OVER`], and only
//!   refusals above the usual count; a limit's refusals stop long before,
//!   once the runs have backed off, so the usual fraction stays near zero
//!   for runs that share one. Such a store still costs a learning run its
//!   first seconds near the floor, and the climb back.
//!
//! Answers to requests sent before the last decrease are not counted: a
//! store that queues requests before it refuses them (MinIO does, up to
//! its deadline) answers for the old rate long after the run left it, and
//! those answers would lower the new cap for the old one's sins. A cap the
//! user set (`--max-request-rate`) or a store budget share bounds all of
//! this; a fixed `--concurrency` turns learning off, as it turns off the
//! concurrency climb.
//!
//! [`Governor`] is the decision alone, a pure state machine tested on
//! synthetic stores; [`RateControl`] counts a run's answers into windows,
//! asks the governor and paces request starts to the result.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::pacing::Pacer;
use crate::metrics::Metrics;

/// The shortest measuring window.
pub const WINDOW: Duration = Duration::from_millis(200);
/// A window closes once it holds this many answers (or at [`LONGEST_WINDOW`]):
/// a refused fraction of fewer says little.
pub const MIN_ANSWERS: u64 = 20;
/// A window this old closes with whatever answers it holds.
pub const LONGEST_WINDOW: Duration = Duration::from_secs(4);
/// A refused fraction up to this is noise.
pub const MARGIN: f64 = 0.02;
/// A decrease sets the cap to this share of what the store accepted.
pub const BACK_OFF: f64 = 0.9;
/// One decrease at most quarters the rate: a burst of refusals says "far
/// too fast", but one window is too short to say how far.
pub const DEEPEST: f64 = 0.25;
/// Quiet windows raise the cap by this many requests per second, per second.
pub const ADDITIVE: f64 = 4.0;
/// How long the refused fraction takes to become the usual one (the time
/// constant of its moving average): a limit's refusals stop long before,
/// once the runs have backed off; a store's own go on.
pub const USUAL_OVER: Duration = Duration::from_secs(5);
/// The lowest cap, in requests per second.
pub const FLOOR: f64 = 1.0;
/// A cap this many times above the rate the run asks for binds nothing.
const SLACK: f64 = 2.0;

/// What one window of answers saw.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Answers {
    /// Requests the store answered, refusals included.
    pub answered: u64,
    /// Of those, the ones it refused as throttled.
    pub throttled: u64,
    /// The window's length.
    pub seconds: f64,
}

impl Answers {
    fn rate(&self) -> f64 {
        self.answered as f64 / self.seconds.max(1e-3)
    }

    fn refused(&self) -> f64 {
        self.throttled as f64 / self.answered.max(1) as f64
    }
}

/// The learned request-rate cap: AIMD on the refused fraction.
#[derive(Clone, Debug, Default)]
pub struct Governor {
    /// Requests per second; `None` while nothing was refused (or since the
    /// cap was lifted).
    cap: Option<f64>,
    /// The refused fraction the store has shown lately, averaged over
    /// about [`USUAL_OVER`].
    usual: f64,
}

impl Governor {
    /// The cap in force, in requests per second.
    pub fn cap(&self) -> Option<f64> {
        self.cap
    }

    /// Takes one window's answers; returns the cap for the next.
    pub fn observe(&mut self, window: Answers) -> Option<f64> {
        if window.answered == 0 {
            return self.cap;
        }
        let refused = window.refused();
        // What the store refuses as usual, beyond noise, is its own, and
        // noise grows with it: a usual 20% shows as 30% in some windows
        // of a few dozen answers.
        let excess = refused > MARGIN + (self.usual - MARGIN).max(0.0) * 1.5;
        self.usual += (refused - self.usual) * (1.0 - (-window.seconds / USUAL_OVER.as_secs_f64()).exp());
        if !excess {
            self.cap = self.cap.and_then(|cap| (cap < SLACK * window.rate()).then(|| cap + window.seconds * ADDITIVE));
            return self.cap;
        }
        // Answers may come faster than the cap for a while (a queue at the
        // store draining): what the run asked for is the lower of the two.
        let asked = self.cap.map_or(window.rate(), |cap| cap.min(window.rate()));
        self.cap = Some((asked * (BACK_OFF * (1.0 - refused)).max(DEEPEST)).max(FLOOR));
        self.cap
    }
}

/// A run's request-rate cap: the one set from outside (the user's, a store
/// budget share) and below it the one learned from throttling.
#[derive(Debug)]
pub struct RateControl {
    pacer: Pacer,
    /// How many times the cap came down: a request that passed the pacer
    /// before a decrease and then waited for a slot takes its turn again.
    lowered: AtomicU64,
    metrics: Arc<Metrics>,
    /// Whether the run learns a cap (adaptive concurrency).
    learns: bool,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    governor: Governor,
    /// The cap set from outside.
    set: Option<u64>,
    window_start: Instant,
    /// When the learned cap last came down.
    lowered_at: Option<Instant>,
    answered: u64,
    throttled: u64,
}

impl RateControl {
    /// A control under the cap `set`, learning one below it if `learns`.
    pub fn new(set: Option<u64>, learns: bool, metrics: Arc<Metrics>) -> Self {
        let state = State {
            governor: Governor::default(),
            set,
            window_start: Instant::now(),
            lowered_at: None,
            answered: 0,
            throttled: 0,
        };
        metrics.set_request_rate_cap(set);
        Self { pacer: Pacer::new(set), lowered: AtomicU64::new(0), metrics, learns, state: Mutex::new(state) }
    }

    /// Waits for the next request's turn.
    pub async fn take(&self) {
        self.pacer.take(1).await;
    }

    /// How many times the cap came down so far.
    pub fn lowered(&self) -> u64 {
        self.lowered.load(Relaxed)
    }

    /// Changes the cap set from outside; returns whether it changed.
    pub fn set(&self, cap: Option<u64>) -> bool {
        let mut state = self.state.lock().expect("rate control poisoned");
        let changed = state.set != cap;
        state.set = cap;
        self.apply(&state);
        changed
    }

    /// The cap in force (the lower of the two), in requests per second.
    pub fn cap(&self) -> Option<u64> {
        self.pacer.rate()
    }

    /// The cap learned from throttling, if any.
    pub fn learned(&self) -> Option<u64> {
        self.state.lock().expect("rate control poisoned").governor.cap().map(whole)
    }

    /// Counts the store's answer to a request sent at `sent`; closes the
    /// window when it is due.
    pub fn answered(&self, throttled: bool, sent: Instant) {
        if !self.learns {
            return;
        }
        let now = Instant::now();
        let mut state = self.state.lock().expect("rate control poisoned");
        if state.lowered_at.is_some_and(|lowered| sent < lowered) {
            return;
        }
        state.answered += 1;
        state.throttled += u64::from(throttled);
        let elapsed = now.duration_since(state.window_start);
        if elapsed < WINDOW || (state.answered < MIN_ANSWERS && elapsed < LONGEST_WINDOW) {
            return;
        }
        let window = Answers { answered: state.answered, throttled: state.throttled, seconds: elapsed.as_secs_f64() };
        (state.window_start, state.answered, state.throttled) = (now, 0, 0);
        let before = state.governor.cap();
        let after = state.governor.observe(window);
        tracing::trace!(?before, ?after, refused = window.throttled, answered = window.answered, "request rate window");
        if after.is_some_and(|after| before.is_none_or(|before| after < before)) {
            state.lowered_at = Some(now);
        }
        if before.map(whole) != after.map(whole) {
            tracing::debug!(
                ?before,
                ?after,
                refused = window.throttled,
                answered = window.answered,
                "request rate cap"
            );
            self.apply(&state);
        }
    }

    fn apply(&self, state: &State) {
        let cap = ferry_contract::budget::tighter(state.governor.cap().map(whole), state.set);
        if cap.is_some_and(|cap| self.pacer.rate().is_none_or(|before| cap < before)) {
            self.lowered.fetch_add(1, Relaxed);
        }
        self.pacer.set_rate(cap);
        self.metrics.set_request_rate_cap(cap);
    }
}

fn whole(rate: f64) -> u64 {
    rate.round().max(FLOOR) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store that serves `limit` requests per second among everyone who
    /// asks and refuses the rest, plus `noise` of everything whatever the rate.
    struct Store {
        limit: f64,
        noise: f64,
    }

    impl Store {
        /// One window of `seconds`: what each of `asked` (requests per
        /// second, per run) got back.
        fn answer(&self, asked: &[f64], seconds: f64) -> Vec<Answers> {
            let total: f64 = asked.iter().sum();
            let over = if total > self.limit { 1.0 - self.limit / total } else { 0.0 };
            let refused = 1.0 - (1.0 - over) * (1.0 - self.noise);
            asked
                .iter()
                .map(|rate| {
                    let answered = (rate * seconds).round() as u64;
                    Answers { answered, throttled: (answered as f64 * refused).round() as u64, seconds }
                })
                .collect()
        }
    }

    /// Runs `runs` governors, each asking for `demand` requests per second
    /// under its cap, for `windows` half-second windows; returns the total
    /// rate asked for and the refused fraction of every window.
    fn simulate(store: &Store, runs: usize, demand: f64, windows: usize) -> Vec<(f64, f64)> {
        simulate_staggered(store, runs, demand, windows, 0).0
    }

    /// As [`simulate`], with run `i` starting at window `i * stagger`; also
    /// returns each run's last cap.
    fn simulate_staggered(
        store: &Store,
        runs: usize,
        demand: f64,
        windows: usize,
        stagger: usize,
    ) -> (Vec<(f64, f64)>, Vec<Option<f64>>) {
        let mut governors = vec![Governor::default(); runs];
        let trace = (0..windows)
            .map(|window| {
                let asked: Vec<f64> = governors
                    .iter()
                    .enumerate()
                    .map(
                        |(run, g)| {
                            if window < run * stagger { 0.0 } else { g.cap().map_or(demand, |cap| cap.min(demand)) }
                        },
                    )
                    .collect();
                let answers = store.answer(&asked, 0.5);
                for (governor, window) in governors.iter_mut().zip(&answers) {
                    governor.observe(*window);
                }
                let (answered, throttled) = answers.iter().fold((0, 0), |(a, t), w| (a + w.answered, t + w.throttled));
                (asked.iter().sum(), throttled as f64 / answered.max(1) as f64)
            })
            .collect();
        (trace, governors.iter().map(Governor::cap).collect())
    }

    #[test]
    fn runs_that_share_a_store_settle_just_under_its_limit_and_stay_there() {
        // Twenty runs that would each ask for 200 requests/s, a store that
        // serves 1000: 4000 asked, three quarters refused, at first.
        let store = Store { limit: 1000.0, noise: 0.0 };
        let trace = simulate(&store, 20, 200.0, 240);
        assert!(trace[0].1 > 0.7, "{:?}", trace[0]);
        let settled = &trace[40..];
        let mean = settled.iter().map(|(rate, _)| rate).sum::<f64>() / settled.len() as f64;
        let refused = settled.iter().map(|(_, refused)| refused).sum::<f64>() / settled.len() as f64;
        let (low, high) = settled.iter().fold((f64::MAX, 0.0f64), |(l, h), (rate, _)| (l.min(*rate), h.max(*rate)));
        assert!((800.0..=1050.0).contains(&mean), "the total settles around the limit: {mean}");
        assert!(refused < 0.02, "refusals after settling: {refused}");
        assert!(low > 600.0 && high < 1200.0, "no swings to idle or to a flood: {low}..{high}");
    }

    #[test]
    fn runs_that_join_late_get_their_part_and_none_takes_the_store() {
        // One run every two windows: the early ones have backed off and
        // climbed again by the time the last ones meet their first refusal.
        let store = Store { limit: 1000.0, noise: 0.0 };
        let (trace, caps) = simulate_staggered(&store, 20, 200.0, 400, 2);
        let settled = &trace[200..];
        let refused = settled.iter().map(|(_, refused)| refused).sum::<f64>() / settled.len() as f64;
        assert!(refused < 0.02, "refusals after settling: {refused}");
        let caps: Vec<f64> = caps.into_iter().map(|cap| cap.expect("every run capped")).collect();
        let (low, high) = caps.iter().fold((f64::MAX, 0.0f64), |(l, h), cap| (l.min(*cap), h.max(*cap)));
        assert!(high < 3.0 * low, "no run keeps many times another's part: {caps:?}");
    }

    #[test]
    fn a_store_that_refuses_a_share_whatever_the_rate_holds_the_runs_back_only_for_a_while() {
        // Two of every three requests refused, as the engine's fault tests
        // refuse each object's first two reads, far below any limit.
        let store = Store { limit: 1e9, noise: 0.67 };
        let trace = simulate(&store, 4, 100.0, 240);
        let later = &trace[80..];
        let asked = later.iter().map(|(rate, _)| rate).sum::<f64>() / later.len() as f64;
        assert!(asked > 300.0, "after the first 40 s the runs go on near their 400 requests/s: {asked}");
    }

    #[test]
    fn a_few_refusals_whatever_the_rate_do_not_bring_the_cap_down() {
        // One request in a hundred refused, far below any limit.
        let store = Store { limit: 1e9, noise: 0.01 };
        let trace = simulate(&store, 4, 100.0, 240);
        assert!(trace.iter().all(|(asked, _)| *asked == 400.0), "{trace:?}");
        // ...but a tenth is more than noise.
        let store = Store { limit: 1e9, noise: 0.1 };
        let trace = simulate(&store, 4, 100.0, 4);
        assert!(trace[3].0 < 400.0, "{trace:?}");
    }

    #[test]
    fn a_single_refusal_backs_off_once_and_quiet_windows_lift_the_cap() {
        let mut governor = Governor::default();
        let window = |answered, throttled| Answers { answered, throttled, seconds: 0.5 };
        assert_eq!(governor.observe(window(100, 0)), None, "nothing refused, no cap");
        let cap = governor.observe(window(100, 10)).unwrap();
        assert!((161.0..=163.0).contains(&cap), "0.9 of the 180/s accepted: {cap}");
        let again = governor.observe(window(100, 10)).unwrap();
        assert!((130.0..=132.0).contains(&again), "judged on the cap, not on the 200/s answered: {again}");
        let cap = again;
        let raised = governor.observe(window(81, 0)).unwrap();
        assert!(raised > cap, "{raised} after {cap}");
        let mut last = raised;
        for _ in 0..100 {
            match governor.observe(window(60, 0)) {
                Some(cap) => last = cap,
                None => break,
            }
        }
        assert_eq!(governor.cap(), None, "lifted once it binds nothing (last {last})");
    }

    #[test]
    fn one_decrease_at_most_quarters_the_rate_and_the_floor_holds() {
        let mut governor = Governor::default();
        let cap = governor.observe(Answers { answered: 100, throttled: 99, seconds: 0.5 }).unwrap();
        assert_eq!(cap, 50.0, "200/s with 99% refused: a quarter, not cut to 2");
        let mut governor = Governor::default();
        let cap = governor.observe(Answers { answered: 4, throttled: 4, seconds: 4.0 }).unwrap();
        assert_eq!(cap, FLOOR);
    }

    #[tokio::test(start_paused = true)]
    async fn the_rate_control_paces_to_the_lower_of_the_set_and_the_learned_cap() {
        let metrics = Arc::new(Metrics::new());
        let control = RateControl::new(Some(50), true, Arc::clone(&metrics));
        assert_eq!(control.cap(), Some(50));
        // 40 answers/s, half refused: just under the 20/s accepted.
        let first_sent = Instant::now();
        for n in 0..20 {
            control.answered(n % 2 == 0, Instant::now());
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        let learned = control.learned().unwrap();
        assert!((18..=20).contains(&learned), "{learned}");
        assert_eq!(control.lowered(), 1);
        // Refusals of requests sent before the cap came down say nothing of it.
        for _ in 0..40 {
            control.answered(true, first_sent);
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        assert_eq!(control.learned(), Some(learned));
        assert_eq!(control.cap(), Some(learned));
        assert!(metrics.encode().contains(&format!("ferry_stager_request_rate_cap {learned}\n")));
        assert!(control.set(Some(10)), "a new share");
        assert_eq!(control.cap(), Some(10), "the share is lower");
        assert!(!control.set(Some(10)));
        control.set(None);
        assert_eq!(control.cap(), Some(learned), "the learned cap holds without a share");
        let fixed = RateControl::new(None, false, metrics);
        for _ in 0..100 {
            fixed.answered(true, Instant::now());
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!((fixed.cap(), fixed.learned()), (None, None), "fixed concurrency learns nothing");
    }
}
