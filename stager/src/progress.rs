//! The terminal progress bar (bytes, objects, rate, ETA) and a log writer
//! that keeps log lines from tearing through it.
//!
//! The bar polls the run's [`Tally`] a few times a second instead of being
//! updated from the data path, so the hot loop only touches atomics. When
//! progress is forced (`--progress always`) but stderr is not a terminal (a
//! container log), a plain progress line is logged every few seconds instead.

use std::io::{IsTerminal as _, Write};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use ferry_engine::transfer::tally::Tally;

pub use ferry_contract::cli::ProgressMode;

static ACTIVE: Mutex<Option<ProgressBar>> = Mutex::new(None);

/// A running progress display; stops when finished.
#[derive(Debug)]
pub struct Progress {
    bar: Option<ProgressBar>,
    ticker: tokio::task::JoinHandle<()>,
}

impl Progress {
    /// Starts a bar for `tally`, or returns `None` when `mode` says not to.
    pub fn start(mode: ProgressMode, tally: Arc<Tally>) -> Option<Self> {
        let terminal = std::io::stderr().is_terminal();
        match mode {
            ProgressMode::Never => return None,
            ProgressMode::Auto if !terminal => return None,
            ProgressMode::Always if !terminal => return Some(Self::lines(tally)),
            _ => {}
        }
        let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
        bar.set_style(
            ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta} {msg}",
            )
            .expect("static template"),
        );
        *ACTIVE.lock().expect("progress lock poisoned") = Some(bar.clone());
        let ticking = bar.clone();
        let ticker = tokio::spawn(async move {
            loop {
                let snapshot = tally.snapshot();
                ticking.set_length(snapshot.bytes_selected);
                ticking.set_position(snapshot.bytes_done);
                let plus = if snapshot.listing_done { "" } else { "+" };
                ticking.set_message(format!("{}/{}{plus} objects", snapshot.objects_done, snapshot.objects_selected));
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        Some(Self { bar: Some(bar), ticker })
    }

    /// Logs a progress line every few seconds.
    fn lines(tally: Arc<Tally>) -> Self {
        let ticker = tokio::spawn(async move {
            let started = std::time::Instant::now();
            loop {
                tokio::time::sleep(Duration::from_secs(5)).await;
                let s = tally.snapshot();
                let rate = s.bytes_done as f64 / started.elapsed().as_secs_f64().max(1e-3);
                tracing::info!(
                    bytes_done = s.bytes_done,
                    bytes_selected = s.bytes_selected,
                    objects_done = s.objects_done,
                    objects_selected = s.objects_selected,
                    listing_done = s.listing_done,
                    bytes_per_second = rate as u64,
                    "progress"
                );
            }
        });
        Self { bar: None, ticker }
    }

    /// Stops the display and clears the bar from the terminal.
    pub fn finish(self) {
        self.ticker.abort();
        *ACTIVE.lock().expect("progress lock poisoned") = None;
        if let Some(bar) = self.bar {
            bar.finish_and_clear();
        }
    }
}

/// A `tracing` writer that hides the bar while a line is written.
#[derive(Clone, Copy, Debug, Default)]
pub struct LogWriter;

impl Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let bar = ACTIVE.lock().expect("progress lock poisoned").clone();
        match bar {
            Some(bar) => bar.suspend(|| std::io::stderr().write_all(buf))?,
            None => std::io::stderr().write_all(buf)?,
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogWriter {
    type Writer = LogWriter;

    fn make_writer(&'a self) -> Self::Writer {
        *self
    }
}
