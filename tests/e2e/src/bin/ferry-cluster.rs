//! `ferry-cluster up [--dir DIR]`: the e2e cluster from a shell, for the demo
//! and for debugging. Prints how to reach it and runs until interrupted,
//! then tears everything down.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(about = "A local Kubernetes control plane with process-running node agents or real nodes")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Start the cluster and keep it running until Ctrl-C or SIGTERM.
    Up {
        /// Keep the cluster's state here (default: a temporary directory, removed on exit).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Write the admin kubeconfig's path to this file once the cluster is ready.
        #[arg(long)]
        ready_file: Option<PathBuf>,
        /// Real nodes (kubelet, containerd, runc) running the images of
        /// `hack/images.sh --test-images`, instead of process-running node
        /// agents. Needs root and `hack/netns.sh`.
        #[arg(long)]
        real_nodes: bool,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,kube_client::client::builder=off".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let Command::Up { dir, ready_file, real_nodes } = Cli::parse().command;
    // Without --dir, the state lives in a temporary directory removed on exit.
    let temporary = match dir {
        Some(_) => None,
        None => Some(tempfile::Builder::new().prefix("ferry-cluster-").tempdir()?),
    };
    let state = dir.as_deref().or(temporary.as_ref().map(tempfile::TempDir::path)).expect("one of them is set");
    let cluster = if real_nodes {
        ferry_e2e::Cluster::start_with_real_nodes_in(state).await?
    } else {
        ferry_e2e::Cluster::start_in(state).await?
    };
    let control_plane = cluster.control_plane().expect("ferry-cluster always starts a local cluster");
    let kubeconfig = cluster.kubeconfig().display().to_string();
    eprintln!("cluster is up: {}", control_plane.server);
    eprintln!("  export KUBECONFIG={kubeconfig}");
    if ferry_e2e::pod_network_routed() && std::env::var_os("FERRY_IN_NETNS").is_some() {
        // hack/netns.sh: the cluster lives in a network namespace of its own.
        eprintln!("  in another shell, enter its network first: nsenter --target {} --net", std::process::id());
    }
    for node in ferry_e2e::NODES {
        eprintln!("  {node}: local disk at {}", cluster.node_dir(node).unwrap_or_default().display());
    }
    eprintln!("  component logs in {}", control_plane.dir().join("logs").display());
    if let Some(ready_file) = ready_file {
        std::fs::write(ready_file, &kubeconfig)?;
    }
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
    eprintln!("stopping the cluster");
    cluster.stop().await;
    drop(temporary);
    Ok(())
}
