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

use crate::cli::TransferOptions;

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
    let peers = &options.peers;
    let (Some(me), Some(listen)) = (options.worker.as_deref(), peers.peer_listen) else { return Ok(None) };
    let fixed: BTreeMap<String, SocketAddr> = peers.peers.iter().map(|p| (p.name.clone(), p.addr)).collect();
    let directory = watch::Sender::new(fixed);
    let token = std::env::var(PEER_TOKEN_ENV).ok();
    let fleet = Fleet::new(me, peers, token, directory.subscribe(), Arc::clone(metrics))
        .map_err(|e| TransferError::Config(e.to_string()))?;
    let Some(fleet) = fleet else { return Ok(None) };
    let address = server::serve(Arc::clone(&fleet), listen)
        .await
        .map_err(|e| TransferError::Config(format!("cannot serve peers on {listen}: {e}")))?;
    directory.send_modify(|known| {
        known.insert(me.to_owned(), address);
    });
    tracing::info!(%address, group = ?peers.peer_group, "serving peers");
    Ok(Some(Peering { fleet, address, directory }))
}
