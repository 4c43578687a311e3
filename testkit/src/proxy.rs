//! A TCP proxy that corrupts one byte of a marker wherever it appears in
//! what the server sends back, to prove that verification catches a wrong
//! byte that HTTP itself does not (same length, valid framing).
//!
//! The marker is a byte string the test plants in its objects; the proxy
//! flips the last bit of its last byte in every response that carries it,
//! on every connection, so retries see the same corruption. Requests pass
//! unchanged. It also counts what the server sent, so a test can measure a
//! store's egress from outside the client (a marker that never occurs
//! makes it a plain counting proxy).

use std::io::{Read as _, Write as _};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// A running proxy; stops accepting when dropped.
#[derive(Debug)]
pub struct CorruptingProxy {
    /// `http://127.0.0.1:PORT`
    pub endpoint: String,
    counters: Arc<Counters>,
    stop: Arc<AtomicBool>,
}

#[derive(Debug, Default)]
struct Counters {
    corrupted: AtomicU64,
    sent: AtomicU64,
}

impl CorruptingProxy {
    /// Proxies to `upstream` (`http://host:port`, with a path where the
    /// endpoint has one, as an Azure account's does), corrupting `marker`.
    ///
    /// # Panics
    /// If the upstream is not `http://host:port[/path]` or no port can be bound.
    pub fn start(upstream: &str, marker: &[u8]) -> Self {
        assert!(marker.len() >= 2, "a marker needs at least two bytes");
        let upstream = upstream.strip_prefix("http://").expect("an http:// upstream").trim_end_matches('/');
        let (upstream, path) =
            upstream.split_once('/').map_or((upstream, String::new()), |(a, p)| (a, format!("/{p}")));
        let upstream = upstream.to_owned();
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        // The same path on the proxy's address: requests pass unchanged.
        let endpoint = format!("http://{}{path}", listener.local_addr().expect("proxy address"));
        let counters = Arc::new(Counters::default());
        let stop = Arc::new(AtomicBool::new(false));
        let marker: Arc<[u8]> = Arc::from(marker);
        let (count, stopped) = (Arc::clone(&counters), Arc::clone(&stop));
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if stopped.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect(&upstream) else { continue };
                let (marker, count) = (Arc::clone(&marker), Arc::clone(&count));
                std::thread::spawn(move || relay(client, server, &marker, &count));
            }
        });
        Self { endpoint, counters, stop }
    }

    /// How many markers were corrupted so far.
    pub fn corrupted(&self) -> u64 {
        self.counters.corrupted.load(Ordering::Relaxed)
    }

    /// Bytes the server sent to clients so far (headers and bodies).
    pub fn bytes_sent(&self) -> u64 {
        self.counters.sent.load(Ordering::Relaxed)
    }
}

impl Drop for CorruptingProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect(self.endpoint.trim_start_matches("http://"));
    }
}

fn relay(client: TcpStream, server: TcpStream, marker: &[u8], counters: &Counters) {
    let (Ok(mut client_read), Ok(mut server_write)) = (client.try_clone(), server.try_clone()) else { return };
    let upstream = std::thread::spawn(move || {
        let _ = std::io::copy(&mut client_read, &mut server_write);
        let _ = server_write.shutdown(Shutdown::Write);
    });
    corrupt_stream(server, client, marker, counters);
    let _ = upstream.join();
}

/// Copies `from` to `to`, corrupting every `marker`. Bytes that could be the
/// start of a marker are held back until the next read shows whether they
/// are, or until the server pauses (a response may end there).
fn corrupt_stream(mut from: TcpStream, mut to: TcpStream, marker: &[u8], counters: &Counters) {
    let _ = from.set_read_timeout(Some(Duration::from_millis(100)));
    let mut pending: Vec<u8> = Vec::new();
    let mut buffer = vec![0u8; 64 << 10];
    loop {
        let read = match from.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                if !pending.is_empty() && to.write_all(&std::mem::take(&mut pending)).is_err() {
                    return;
                }
                continue;
            }
            Err(_) => break,
        };
        counters.sent.fetch_add(read as u64, Ordering::Relaxed);
        pending.extend_from_slice(&buffer[..read]);
        let mut at = 0;
        while let Some(found) = find(&pending[at..], marker) {
            let last = at + found + marker.len() - 1;
            pending[last] ^= 1;
            counters.corrupted.fetch_add(1, Ordering::Relaxed);
            at = last + 1;
        }
        let keep = longest_marker_prefix_suffix(&pending[at..], marker);
        let send = pending.len() - keep;
        if to.write_all(&pending[..send]).is_err() {
            return;
        }
        pending.drain(..send);
    }
    let _ = to.write_all(&pending);
    let _ = to.shutdown(Shutdown::Write);
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The length of the longest end of `bytes` that is a proper start of `marker`.
fn longest_marker_prefix_suffix(bytes: &[u8], marker: &[u8]) -> usize {
    (1..marker.len().min(bytes.len() + 1)).rev().find(|&n| bytes.ends_with(&marker[..n])).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_marker_split_across_reads_is_still_found_and_nothing_else_changes() {
        let echo = TcpListener::bind("127.0.0.1:0").unwrap();
        let upstream = format!("http://{}", echo.local_addr().unwrap());
        std::thread::spawn(move || {
            let (mut socket, _) = echo.accept().unwrap();
            let mut request = [0u8; 5];
            socket.read_exact(&mut request).unwrap();
            for piece in [&b"abcMAR"[..], b"KERdef", b"MARK", b"ERx", b"MA"] {
                socket.write_all(piece).unwrap();
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        let proxy = CorruptingProxy::start(&upstream, b"MARKER");
        let mut client = TcpStream::connect(proxy.endpoint.trim_start_matches("http://")).unwrap();
        client.write_all(b"hello").unwrap();
        let mut received = Vec::new();
        client.read_to_end(&mut received).unwrap();
        assert_eq!(received, b"abcMARKESdefMARKESxMA");
        assert_eq!(proxy.corrupted(), 2);
        assert_eq!(proxy.bytes_sent(), 21);
    }
}
