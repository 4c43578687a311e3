//! One port for `/healthz`, `/readyz` and `/metrics`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::http::StatusCode;
use axum::routing::get;

use crate::metrics::Metrics;

/// Serves until the process exits; `ready` flips `/readyz` to 200.
///
/// # Errors
/// Fails when the address cannot be bound.
pub async fn serve(
    addr: std::net::SocketAddr,
    metrics: Arc<Metrics>,
    ready: Arc<AtomicBool>,
) -> std::io::Result<std::net::SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let app = axum::Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(move || {
                let ready = ready.load(Ordering::Relaxed);
                async move { if ready { (StatusCode::OK, "ok") } else { (StatusCode::SERVICE_UNAVAILABLE, "starting") } }
            }),
        )
        .route(
            "/metrics",
            get(move |headers: axum::http::HeaderMap| {
                let accept = headers.get(axum::http::header::ACCEPT).and_then(|v| v.to_str().ok());
                let (content_type, body) = metrics.render(accept);
                async move { ([(axum::http::header::CONTENT_TYPE, content_type)], body) }
            }),
        );
    tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, app).await {
            tracing::error!(%error, "http server stopped");
        }
    });
    Ok(bound)
}
