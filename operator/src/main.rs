//! The `ferry-operator` binary: parse flags, set up logging, run.

use clap::Parser as _;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let config = ferry_operator::config::OperatorConfig::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,kube_runtime=warn,kube_client=warn".into()),
        )
        .json()
        .init();
    ferry_operator::run(config).await
}
