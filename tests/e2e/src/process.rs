//! Child processes that never outlive their owner.
//!
//! Every process starts in its own process group, writes stdout and stderr
//! to a log file, and is stopped (SIGTERM to the group, then SIGKILL after a
//! grace period) when its handle is dropped or stopped, so a failed test does
//! not leak servers or pods.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process_group};

/// A running child process in its own process group.
#[derive(Debug)]
pub struct ManagedProcess {
    name: String,
    child: Child,
    log: PathBuf,
    exited: Option<ExitStatus>,
    // Kept to start the same program again (`restart`).
    command: Command,
}

impl ManagedProcess {
    /// Starts `command` with output to `log`, in a new process group.
    ///
    /// # Errors
    /// Fails when the log cannot be created or the program cannot start.
    pub fn spawn(name: &str, mut command: Command, log: &Path) -> std::io::Result<Self> {
        let file = std::fs::File::create(log)?;
        let child = start(name, &mut command, file)?;
        Ok(Self { name: name.to_owned(), child, log: log.to_path_buf(), exited: None, command })
    }

    /// Stops the process as [`ManagedProcess::stop`] does, then starts the
    /// same command again, its output appended to the same log: a
    /// component's restart, for fault tests.
    ///
    /// # Errors
    /// Fails when the program cannot start again.
    pub fn restart(&mut self, grace: Duration) -> std::io::Result<()> {
        self.stop(grace);
        let file = std::fs::OpenOptions::new().append(true).open(&self.log)?;
        self.child = start(&self.name, &mut self.command, file)?;
        self.exited = None;
        Ok(())
    }

    /// The process id (also its process group id).
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// The exit status, if it has exited.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        if self.exited.is_none() {
            self.exited = self.child.try_wait().ok().flatten();
        }
        self.exited
    }

    /// The last `lines` lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        tail(&self.log, lines)
    }

    /// The path of its log.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Sends `signal` to the whole process group.
    pub fn signal_group(&self, signal: Signal) {
        if let Some(pid) = Pid::from_raw(self.child.id() as i32) {
            let _ = kill_process_group(pid, signal);
        }
    }

    /// SIGTERM to the group, then SIGKILL after `grace`; waits for the exit.
    pub fn stop(&mut self, grace: Duration) -> Option<ExitStatus> {
        if self.try_wait().is_none() {
            self.signal_group(Signal::TERM);
            let deadline = Instant::now() + grace;
            while Instant::now() < deadline && self.try_wait().is_none() {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        // Also kill stragglers the leader left in its group.
        self.signal_group(Signal::KILL);
        if self.exited.is_none() {
            self.exited = self.child.wait().ok();
        }
        self.exited
    }

    /// Its name, for messages.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// Starts `command` in a new process group with its output to `log`.
fn start(name: &str, command: &mut Command, log: std::fs::File) -> std::io::Result<Child> {
    use std::os::unix::process::CommandExt as _;
    command
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0)
        .spawn()
        .map_err(|e| std::io::Error::new(e.kind(), format!("starting {name}: {e}")))
}

impl Drop for ManagedProcess {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(3));
    }
}

/// The last `lines` lines of a file (empty if unreadable).
pub fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// A binary of this workspace, built in the same profile as the running
/// executable (`target/<profile>/<name>`; tests run from `target/<profile>/deps`).
pub fn workspace_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current executable");
    let mut dir = exe.parent().expect("executable directory").to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir.join(name)
}
