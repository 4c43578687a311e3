//! Fleet staging from the command line: starts the peer port and keeps the
//! peers' addresses, given as `--peer NAME=ADDR`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use ferry_contract::peers::PEER_TOKEN_ENV;
use ferry_engine::fleet::{Fleet, server};
use ferry_engine::metrics::Metrics;
use ferry_engine::transfer::TransferError;
use tokio::sync::watch;

use ferry_contract::cli::TransferOptions;

/// A worker's part in a fleet, running.
#[derive(Debug)]
pub struct Peering {
    /// The fleet state the engine uses.
    pub fleet: Arc<Fleet>,
    /// Where this worker serves.
    pub address: SocketAddr,
    /// The peers' addresses; discovery writes here.
    pub directory: watch::Sender<BTreeMap<String, SocketAddr>>,
}

/// Starts serving peers when the options name a peer group; `None` otherwise.
///
/// # Errors
/// The group is unusable (no secret, this worker not in it) or the peer
/// port cannot be bound.
pub async fn start(options: &TransferOptions, metrics: &Arc<Metrics>) -> Result<Option<Peering>, TransferError> {
    start_with_token(options, std::env::var(PEER_TOKEN_ENV).ok(), metrics).await
}

/// [`start`] with the secret given rather than read from the environment.
async fn start_with_token(
    options: &TransferOptions,
    token: Option<String>,
    metrics: &Arc<Metrics>,
) -> Result<Option<Peering>, TransferError> {
    let peers = &options.peers;
    let (Some(me), Some(listen)) = (options.worker.as_deref(), peers.peer_listen) else { return Ok(None) };
    let fixed: BTreeMap<String, SocketAddr> = peers.peers.iter().map(|p| (p.name.clone(), p.addr)).collect();
    let directory = watch::Sender::new(fixed);
    let fleet = Fleet::new(me, peers, token, directory.subscribe(), Arc::clone(metrics))
        .map_err(|e| TransferError::Config(e.to_string()))?;
    let Some(fleet) = fleet else { return Ok(None) };
    // The port stays open until the process exits: peers that finish
    // later are still served while this worker lingers.
    let address = server::serve(Arc::clone(&fleet), listen, std::future::pending())
        .await
        .map_err(|e| TransferError::Config(format!("cannot serve peers on {listen}: {e}")))?;
    directory.send_modify(|known| {
        known.insert(me.to_owned(), address);
    });
    tracing::info!(%address, group = ?peers.peer_group, "serving peers");
    Ok(Some(Peering { fleet, address, directory }))
}

impl Peering {
    /// Gives up on peers: discovery cannot work (`why`), so every peer's
    /// share is read from the store now rather than after the peer timeout.
    pub fn alone(&self, why: &str) {
        self.fleet.alone(why);
        // Wakes the reads that wait for an address, so they see the peers
        // are dropped.
        self.directory.send_modify(|_| {});
    }

    /// Records the peers discovery saw exit (their run in the DataStage's
    /// status is finished): their shares are read from the store now,
    /// not after the peer timeout.
    pub fn exited(&self, peers: &[String]) {
        if peers.is_empty() {
            return;
        }
        for peer in peers {
            self.fleet.exited(peer);
        }
        // Wakes the reads that wait for an address, so they see it.
        self.directory.send_modify(|_| {});
    }

    /// Records the peer addresses discovery found (from the DataStage's
    /// status); returns whether any was new or had changed. A worker that
    /// restarted publishes a new address, which replaces the old one; a
    /// peer missing from `published` keeps the address it had, since the
    /// fleet drops peers that stop answering on its own.
    pub fn learned(&self, published: Vec<(String, SocketAddr)>) -> bool {
        self.directory.send_if_modified(|known| {
            let mut changed = false;
            for (name, address) in published {
                if known.get(&name) != Some(&address) {
                    known.insert(name, address);
                    changed = true;
                }
            }
            changed
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_contract::PeerOptions;

    #[tokio::test]
    async fn learned_addresses_replace_old_ones_and_wake_the_fleet_only_on_change() {
        let options = TransferOptions {
            worker: Some("a".into()),
            peers: PeerOptions {
                peer_group: vec!["a".into(), "b".into()],
                peer_listen: Some("127.0.0.1:0".parse().unwrap()),
                ..PeerOptions::default()
            },
            ..TransferOptions::default()
        };
        let metrics = Arc::new(Metrics::new());
        let peering = start_with_token(&options, Some("secret".into()), &metrics).await.unwrap().expect("in a group");
        let mut seen = peering.directory.subscribe();
        seen.mark_unchanged();
        let b: SocketAddr = "10.0.0.2:9466".parse().unwrap();
        assert!(peering.learned(vec![("b".into(), b)]));
        assert!(seen.has_changed().unwrap());
        seen.mark_unchanged();
        assert!(!peering.learned(vec![("b".into(), b)]), "nothing new");
        assert!(!seen.has_changed().unwrap());
        let restarted: SocketAddr = "10.0.0.3:9466".parse().unwrap();
        assert!(peering.learned(vec![("b".into(), restarted)]));
        assert_eq!(peering.directory.borrow().get("b"), Some(&restarted));
        assert_eq!(peering.directory.borrow().get("a"), Some(&peering.address));
    }
}
