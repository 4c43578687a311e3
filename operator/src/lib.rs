//! The Ferry operator: watches `DataStage` resources and carries them out
//! with `ferry-stager` Jobs.
//!
//! * [`config`]: flags, parsed once.
//! * [`controller`]: the reconcile pipeline (validate → build → apply → status).
//! * [`jobs`]: pure builders of worker Jobs.
//! * [`status`]: pure aggregation of worker results into status and conditions.
//! * [`metrics`] and [`http`]: what the operator shows of itself.

pub mod config;
pub mod controller;
pub mod http;
pub mod jobs;
pub mod metrics;
pub mod status;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Starts the HTTP endpoint and runs the controller until stopped.
///
/// # Errors
/// Fails when no client can be configured or the port cannot be bound.
pub async fn run(config: config::OperatorConfig) -> Result<(), Box<dyn std::error::Error>> {
    let client = kube::Client::try_default().await?;
    let metrics = Arc::new(metrics::Metrics::default());
    let ready = Arc::new(AtomicBool::new(false));
    let bound = http::serve(config.http_addr, Arc::clone(&metrics), Arc::clone(&ready)).await?;
    tracing::info!(%bound, stager_image = %config.stager_image, "ferry-operator started");
    let ctx = controller::context(client, config, metrics);
    ready.store(true, Ordering::Relaxed);
    controller::run(ctx).await;
    Ok(())
}
