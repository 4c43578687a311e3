//! The `ferry-operator` binary: parse flags, set up logging, run.

use std::process::ExitCode;

use clap::Parser as _;

#[tokio::main]
async fn main() -> ExitCode {
    let config = ferry_operator::config::OperatorConfig::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,kube_runtime=warn,kube_client=warn".into()),
        )
        .json()
        .init();
    match ferry_operator::run(config).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            // Said in words, with its causes, for whoever reads the pod's
            // log or the terminal: a flag to fix, a cluster not reached.
            let mut message = format!("ferry-operator: {error}");
            let mut cause = error.source();
            while let Some(inner) = cause {
                message.push_str(&format!(": {inner}"));
                cause = inner.source();
            }
            eprintln!("{message}");
            ExitCode::FAILURE
        }
    }
}
