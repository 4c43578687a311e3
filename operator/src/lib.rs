//! The Ferry operator: watches `DataStage` resources and carries them out
//! with `ferry-stager` Jobs.
//!
//! * [`config`]: flags, parsed and checked once.
//! * [`context`]: what every part shares (client, caches, what is remembered).
//! * [`cache`]: Nodes, and DataStages' Jobs and Pods, as watches last saw them.
//! * [`watch_backoff`]: how soon those watches try again after an error.
//! * [`admission`]: what a DataStage may ask for, for the webhook and the controller.
//! * [`controller`]: the reconcile pipeline (prepare → carry out → status).
//! * [`home`]: where a DataStage's workers run, and how what is made there is named.
//! * [`delivery`]: the credentials, CA and tokens that reach workers in Ferry's namespace.
//! * [`volumes`]: the volume and claim through which pods read node-local data.
//! * [`sweeper`]: what a deleted DataStage leaves outside its namespace.
//! * [`worker`]: a DataStage's workers (one per node, or one per claim).
//! * [`placement`]: which nodes a per-node DataStage stages onto.
//! * [`placement_syntax`]: whether a placement is what the API server accepts in a pod.
//! * [`node_wakes`]: which Node events wake DataStages (changes, deletions).
//! * [`runs`]: which run is current (new spec, schedule) and its inputs.
//! * [`schedule`]: cron schedules of re-syncs.
//! * [`jobs`]: pure builders of worker Jobs.
//! * [`peers`]: what the workers of a PeerToPeer DataStage need to feed each other.
//! * [`certs`]: the CAs and certificates the operator issues (webhook, peers).
//! * [`budgets`] and [`starting`]: StoreBudgets: the share of one each new worker gets.
//! * [`quotas`]: StagingQuotas: the room they leave each worker, their status.
//! * [`disks`]: room on nodes' disks, and when a run a full disk refused starts again.
//! * [`status`]: pure aggregation of worker results into status and conditions.
//! * [`leader`]: Lease-based leader election, so replicas are safe.
//! * [`webhook`]: the admission webhooks: DataStages judged, training pods wired to their data.
//! * [`gates`]: lifts those pods' scheduling gates once the data is ready.
//! * [`metrics`] and [`http`]: what the operator shows of itself.

pub mod admission;
pub mod budgets;
pub mod cache;
pub mod certs;
pub mod config;
pub mod context;
pub mod controller;
pub mod delivery;
pub mod disks;
pub mod events;
pub mod eviction;
pub mod gates;
pub mod home;
pub mod http;
pub mod jobs;
pub mod leader;
pub mod metrics;
pub mod node_wakes;
pub mod peers;
pub mod placement;
pub mod placement_syntax;
pub mod queue_wait;
pub mod quotas;
pub mod runs;
pub mod schedule;
pub mod starting;
pub mod status;
pub mod sweeper;
pub mod versions;
pub mod volumes;
pub mod watch_backoff;
pub mod webhook;
pub mod worker;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Starts the HTTP endpoint and runs the controller until stopped.
///
/// Boxed, so that the controller's code (every reconcile, watch and
/// webhook future) is compiled here, once, rather than in the crate that
/// awaits it: an `async fn` leaves its state machine to its caller, and the
/// binary then spent longer compiling it than this library (58 s against
/// 40 s on two cores after a change to the operator).
///
/// # Errors
/// Fails when no client can be configured or the port cannot be bound.
pub fn run(
    config: config::OperatorConfig,
) -> std::pin::Pin<Box<dyn Future<Output = Result<(), Box<dyn std::error::Error>>>>> {
    Box::pin(run_until_stopped(config))
}

async fn run_until_stopped(config: config::OperatorConfig) -> Result<(), Box<dyn std::error::Error>> {
    let config = config.checked()?;
    let client = kube::Client::try_default().await?;
    let metrics = Arc::new(metrics::Metrics::default());
    let ready = Arc::new(AtomicBool::new(false));
    let bound = http::serve(config.http_addr, Arc::clone(&metrics), Arc::clone(&ready)).await?;
    tracing::info!(%bound, stager_image = %config.stager_image, "ferry-operator started");
    if let Some(addr) = config.webhook_addr {
        // Ready once the webhook's certificate is served and trusted.
        let bound = webhook::start(client.clone(), &config, addr, Arc::clone(&metrics), Arc::clone(&ready)).await?;
        tracing::info!(%bound, certs = ?config.webhook_certs, "webhook serving");
    } else {
        ready.store(true, Ordering::Relaxed);
    }
    let identity = format!(
        "{}-{:08x}",
        std::env::var("HOSTNAME").unwrap_or_else(|_| "ferry-operator".into()),
        rand::random::<u32>()
    );
    let elector =
        leader::Elector::new(client.clone(), &config.leader_election_namespace, identity, config.lease_duration);
    tracing::info!(identity = elector.identity(), "waiting to lead");
    elector.acquire().await;
    tracing::info!(identity = elector.identity(), "leading");
    let gate_pods = config.webhook_addr.is_some();
    let scopes = controller::watch_scopes(&config).len();
    let (ctx, cache_writers) = context::context_with(client, config, metrics, scopes);
    let gates = async {
        if gate_pods {
            gates::run(Arc::clone(&ctx)).await;
        } else {
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        () = controller::run(Arc::clone(&ctx), cache_writers) => Ok(()),
        () = gates => Ok(()),
        () = elector.keep_leading() => Err("lost the leader lease; exiting so a fresh replica can take over".into()),
    }
}
