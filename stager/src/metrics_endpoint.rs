//! The metrics endpoint: the engine's registry served at `/metrics` in the
//! format the scraper asks for.

use std::net::SocketAddr;
use std::sync::Arc;

use ferry_engine::metrics::Metrics;

/// Serves `/metrics` on `addr` until the process exits.
///
/// # Errors
/// Fails when the address cannot be bound.
pub async fn serve(addr: SocketAddr, metrics: Arc<Metrics>) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move |headers: axum::http::HeaderMap| {
            let accept = headers.get(axum::http::header::ACCEPT).and_then(|v| v.to_str().ok());
            let (content_type, body) = ferry_exposition::render(metrics.registry(), accept);
            async move { ([(axum::http::header::CONTENT_TYPE, content_type)], body) }
        }),
    );
    tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, app).await {
            tracing::warn!(%error, "metrics server stopped");
        }
    });
    Ok(bound)
}
